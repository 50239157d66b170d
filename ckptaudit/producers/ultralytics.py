"""ultralytics (YOLO): ``weights/last.pt`` and ``weights/best.pt``, whole pickled models resumed by epoch.

Sources: the ultralytics 8.4.190 wheel (which wrote the tests' runs); line numbers are of that wheel.

* ``ultralytics/engine/trainer.py``: ``self.wdir = save_dir / "weights"``, ``self.last, self.best = wdir /
  "last.pt", wdir / "best.pt"`` (:163-168).  ``save_model`` (:768-837) ``torch.save``\\ s one dict into a
  ``BytesIO`` and writes those bytes with ``Path.write_bytes`` to ``last.pt`` (:832), to ``best.pt`` when this
  epoch's fitness is the best (:833-834) and to ``epoch<N>.pt`` every ``save_period`` epochs (:835-836): in place,
  no temporary name, so a kill inside the write leaves ``last.pt`` cut under its own name and ``best.pt`` on the
  epoch it last improved.  The dict: ``epoch`` (the epoch just trained, 0-based), ``best_fitness``, ``stopper``,
  ``model`` (None), ``ema`` (the EMA model itself, a whole ``DetectionModel`` in float16), ``updates`` (EMA
  updates), ``modelopt``, ``optimizer`` (its state dict in float16), ``scaler``, ``train_args``
  (``vars(args)``), ``train_metrics``, ``train_results`` (results.csv as columns), ``date``, ``version``,
  ``git``, ``license``, ``docs``.  No LR scheduler and no RNG state: the resume rebuilds the scheduler at
  ``start_epoch - 1`` (:465).
* At the end of training ``final_eval`` (:1005-1022) rewrites ``last.pt`` and ``best.pt`` through
  ``strip_optimizer`` (``ultralytics/utils/torch_utils.py`` :895-958): ``model`` = the EMA in float16,
  ``optimizer``, ``best_fitness``, ``stopper``, ``ema``, ``updates``, ``scaler`` = None and ``epoch`` = -1.
* The resume: ``YOLO("weights/last.pt").train(resume=True)`` (or ``resume=True`` alone: the newest ``last*.pt``
  under the runs folder by ctime, ``get_latest_run``, ``ultralytics/utils/files.py`` :214-217).
  ``check_resume`` (:1024-1069) loads the file's ``train_args``; ``setup_model`` (:873-) builds the model from
  the pickled one (``load_checkpoint``, ``ultralytics/nn/tasks.py`` :2020-2066: ``ema`` or ``model``);
  ``resume_training`` (:1128-1145) starts at ``epoch + 1`` and asserts ``0 < start_epoch < epochs`` ("training
  to N epochs is finished, nothing to resume" for a stripped file), then ``_load_checkpoint_state`` (:1071-1087)
  restores ``optimizer``, ``scaler``, ``ema`` with ``updates``, ``best_fitness`` and ``stopper``.  The load,
  ``torch_safe_load`` (``nn/tasks.py`` :1873-1925), is ``torch.load(weights_only=False)``
  (``ultralytics/utils/patches.py`` :197-219) unless ``ULTRALYTICS_SAFE_LOAD`` is set: then
  ``weights_only=True`` with ``_SafeLoad``'s allowlist (:1696-1871), which admits exactly the ``nn.Module``
  subclasses of ``torch.nn.modules.*``, ``ultralytics.nn.modules.*``, ``ultralytics.nn.tasks`` (and the classes
  of ``ultralytics.nn.distill_model``), ``IterableSimpleNamespace`` and numpy scalars (:1744-1754, :1833-1871).

The audit: a unit's step is the epoch the resume starts at (``epoch`` + 1; none for a finished, stripped file,
which only a new training can start from); the classes of its whole pickled model are judged by what that
resume loads: :data:`MODEL_CLASSES`, the ``nn.Module`` subclasses ``_SafeLoad`` admits, listed from the
installed ultralytics 8.4.190 and torch 2.13 (``NEWOBJ`` of the class and ``BUILD`` of its ``__dict__``,
``Module.__setstate__``), are what its resume admits (:data:`ADMITS`, the resume load's ``allows``), so in its
files only a name outside them is an unknown import; the same class in a file no such resume reads stays unknown.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .contract import UNSAFE, Contract, FileRole, Producer, ResumeLoad
from .paths import base, join, parent

#: the folder ``save_model`` writes into, and its file names (``save_period`` adds ``epoch<N>.pt``)
UNIT_FOLDER = "weights"
UNIT_NAMES = r"(?:last|best|epoch\d+)\.pt"
_LAST = "last.pt"
#: what ``resume_training`` adds to the saved ``epoch`` (:1132)
RESUME_NEXT = 1

#: The ``nn.Module`` subclasses defined in each module ``_SafeLoad`` admits (``module.__name__`` -> class names,
#: space-separated), listed from ultralytics 8.4.190 and torch 2.13 (``vars(module)``, ``__module__`` equal).
MODEL_CLASSES: Dict[str, str] = {
    "torch.nn.modules.activation": (
        "CELU ELU GELU GLU Hardshrink Hardsigmoid Hardswish Hardtanh LeakyReLU LogSigmoid LogSoftmax Mish "
        "MultiheadAttention PReLU RReLU ReLU ReLU6 SELU SiLU Sigmoid Softmax Softmax2d Softmin Softplus "
        "Softshrink Softsign Tanh Tanhshrink Threshold"
    ),
    "torch.nn.modules.adaptive": "AdaptiveLogSoftmaxWithLoss",
    "torch.nn.modules.batchnorm": (
        "BatchNorm1d BatchNorm2d BatchNorm3d LazyBatchNorm1d LazyBatchNorm2d LazyBatchNorm3d SyncBatchNorm "
        "_BatchNorm _LazyNormBase _NormBase"
    ),
    "torch.nn.modules.channelshuffle": "ChannelShuffle",
    "torch.nn.modules.container": "Container ModuleDict ModuleList ParameterDict ParameterList Sequential",
    "torch.nn.modules.conv": (
        "Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d ConvTranspose3d LazyConv1d LazyConv2d "
        "LazyConv3d LazyConvTranspose1d LazyConvTranspose2d LazyConvTranspose3d _ConvNd _ConvTransposeMixin "
        "_ConvTransposeNd"
    ),
    "torch.nn.modules.distance": "CosineSimilarity PairwiseDistance",
    "torch.nn.modules.dropout": (
        "AlphaDropout Dropout Dropout1d Dropout2d Dropout3d FeatureAlphaDropout _DropoutNd"
    ),
    "torch.nn.modules.flatten": "Flatten Unflatten",
    "torch.nn.modules.fold": "Fold Unfold",
    "torch.nn.modules.instancenorm": (
        "InstanceNorm1d InstanceNorm2d InstanceNorm3d LazyInstanceNorm1d LazyInstanceNorm2d "
        "LazyInstanceNorm3d _InstanceNorm"
    ),
    "torch.nn.modules.linear": "Bilinear Identity LazyLinear Linear NonDynamicallyQuantizableLinear",
    "torch.nn.modules.loss": (
        "BCELoss BCEWithLogitsLoss CTCLoss CosineEmbeddingLoss CrossEntropyLoss GaussianNLLLoss "
        "HingeEmbeddingLoss HuberLoss KLDivLoss L1Loss LinearCrossEntropyLoss MSELoss MarginRankingLoss "
        "MultiLabelMarginLoss MultiLabelSoftMarginLoss MultiMarginLoss NLLLoss NLLLoss2d PoissonNLLLoss "
        "SmoothL1Loss SoftMarginLoss TripletMarginLoss TripletMarginWithDistanceLoss _Loss _WeightedLoss"
    ),
    "torch.nn.modules.module": "Module",
    "torch.nn.modules.normalization": "CrossMapLRN2d GroupNorm LayerNorm LocalResponseNorm RMSNorm",
    "torch.nn.modules.padding": (
        "CircularPad1d CircularPad2d CircularPad3d ConstantPad1d ConstantPad2d ConstantPad3d "
        "ReflectionPad1d ReflectionPad2d ReflectionPad3d ReplicationPad1d ReplicationPad2d ReplicationPad3d "
        "ZeroPad1d ZeroPad2d ZeroPad3d _CircularPadNd _ConstantPadNd _ReflectionPadNd _ReplicationPadNd"
    ),
    "torch.nn.modules.pixelshuffle": "PixelShuffle PixelUnshuffle",
    "torch.nn.modules.pooling": (
        "AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveMaxPool1d AdaptiveMaxPool2d "
        "AdaptiveMaxPool3d AvgPool1d AvgPool2d AvgPool3d FractionalMaxPool2d FractionalMaxPool3d LPPool1d "
        "LPPool2d LPPool3d MaxPool1d MaxPool2d MaxPool3d MaxUnpool1d MaxUnpool2d MaxUnpool3d "
        "_AdaptiveAvgPoolNd _AdaptiveMaxPoolNd _AvgPoolNd _LPPoolNd _MaxPoolNd _MaxUnpoolNd"
    ),
    "torch.nn.modules.rnn": "GRU GRUCell LSTM LSTMCell RNN RNNBase RNNCell RNNCellBase",
    "torch.nn.modules.sparse": "Embedding EmbeddingBag",
    "torch.nn.modules.transformer": (
        "Transformer TransformerDecoder TransformerDecoderLayer TransformerEncoder TransformerEncoderLayer"
    ),
    "torch.nn.modules.upsampling": "Upsample UpsamplingBilinear2d UpsamplingNearest2d",
    "ultralytics.nn.distill_model": "DistillationModel",
    "ultralytics.nn.modules.activation": "AGLU",
    "ultralytics.nn.modules.block": (
        "A2C2f AAttn ABlock AConv ADown Attention BNContrastiveHead Bottleneck BottleneckCSP C1 C2 C2PSA "
        "C2f C2fAttn C2fCIB C2fPSA C3 C3Ghost C3TR C3f C3k C3k2 C3x CBFuse CBLinear CIB ContrastiveHead DFL "
        "ELAN1 GhostBottleneck HGBlock HGStem ImagePoolingAttn MaxSigmoidAttnBlock PSA PSABlock Proto "
        "Proto26 RealNVP RepBottleneck RepC3 RepCSP RepNCSPELAN4 RepVGGDW ResNetBlock ResNetLayer Residual "
        "SAVPE SCDown SPP SPPELAN SPPF SwiGLUFFN TorchVision"
    ),
    "ultralytics.nn.modules.conv": (
        "CBAM ChannelAttention Concat Conv Conv2 ConvTranspose DWConv DWConvTranspose2d Focus GhostConv "
        "Index LightConv RepConv SpatialAttention"
    ),
    "ultralytics.nn.modules.head": (
        "Classify Depth Detect LRPCHead OBB OBB26 Pose Pose26 RTDETRDecoder Segment Segment26 "
        "SemanticSegment WorldDetect YOLOEDetect YOLOESegment YOLOESegment26 v10Detect"
    ),
    "ultralytics.nn.modules.transformer": (
        "AIFI DeformableTransformerDecoder DeformableTransformerDecoderLayer LayerNorm2d MLP MLPBlock "
        "MSDeformAttn TransformerBlock TransformerEncoderLayer TransformerLayer"
    ),
    "ultralytics.nn.tasks": (
        "BaseModel ClassificationModel DepthModel DetectionModel Ensemble OBBModel PoseModel "
        "RTDETRDetectionModel SegmentationModel SemanticSegmentationModel WorldModel YOLOEModel "
        "YOLOESegModel"
    ),
}
_NAMESPACE = "ultralytics.utils.IterableSimpleNamespace"


#: what its resume admits by name (:attr:`ResumeLoad.allows`): :data:`MODEL_CLASSES` and the model's args, an
#: ``IterableSimpleNamespace`` (a ``types.SimpleNamespace`` subclass with no ``__setstate__`` of its own,
#: ``ultralytics/utils/__init__.py`` :332, that ``_SafeLoad`` allows, :1843-1844)
ADMITS = frozenset([f"{m}.{n}" for m, names in MODEL_CLASSES.items() for n in names.split()] + [_NAMESPACE])


CONTRACT = Contract(
    producer="ultralytics", framework="ultralytics", versions="ultralytics 8.x (tested 8.4.190)",
    layouts=("ultralytics",), match_keys=("epoch", "train_args", "ema"),
    files=(FileRole("*.pt", "mixed", UNSAFE + " (torch_safe_load)"),),
    keys={"weights": ("ema", "model"), "optimizer": ("optimizer",), "scaler": ("scaler",),
          "metadata": ("train_args", "train_metrics", "train_results", "stopper", "best_fitness", "updates",
                       "modelopt", "date", "version", "git", "license", "docs")},
    epoch_at=("*:epoch",),
    saves=frozenset({"weights"}), never_saves=frozenset({"scheduler", "rng"}),
)


def resume_step(tree: dict) -> Optional[Tuple[int, str]]:
    """``(epoch + 1, "epoch")`` of a file's tree that holds ``train_args`` and a saved ``epoch`` >= 0 (where
    ``resume_training`` starts, :1132); None else, and for a finished file (``epoch`` -1: nothing to resume)."""
    if not isinstance(tree, dict) or "train_args" not in tree:
        return None
    epoch = tree.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        return None
    return epoch + RESUME_NEXT, "epoch"


def is_entry(unit: str) -> bool:
    """True for ``weights/last.pt``, the file ``train(resume=True)`` resumes."""
    return base(unit) == _LAST and base(parent(unit)) == UNIT_FOLDER


def default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """``last.pt`` of the weights ``folder`` (what ``YOLO(".../weights/last.pt").train(resume=True)`` loads)."""
    want = join(folder, _LAST)
    return (want if any(u["unit"] == want for u in v.get("units") or []) else None), True


PRODUCER = Producer(
    key="ultralytics", name="ultralytics", layouts=("ultralytics",), contracts=(CONTRACT,),
    unit_names=UNIT_NAMES, unit_folder=UNIT_FOLDER, resume_step=resume_step,
    resume_loads={"mixed": ResumeLoad("ultralytics torch_safe_load: torch.load(weights_only=False) "
                                      "(ultralytics 8.4.190 nn/tasks.py :1925, utils/patches.py :216-217); its "
                                      "model classes are those its weights-only _SafeLoad admits (:1744-1754)",
                                      allows=ADMITS, weights_only=False)},
    resume_call='YOLO("{path}").train(resume=True)',
    default_call='YOLO("<run>/weights/last.pt").train(resume=True)',
    default_pick=default_pick,
    entry=is_entry, entry_call='YOLO("<run>/weights/last.pt").train(resume=True)',
    pip_names={"ultralytics": "ultralytics"},
)
