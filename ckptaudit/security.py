"""Classify the imports a pickle asks for, and turn them into findings.

Every import found by :func:`ckptaudit.pickle_walk.walk` (including those of
nested pickles) falls in one category:

* ``"weights_only"`` – allowed by ``torch.load(weights_only=True)`` of torch
  2.13 with no extra configuration.  The list is encoded below as data from
  ``torch/_weights_only_unpickler.py`` (``_get_allowed_globals`` and
  ``_tensor_rebuild_functions``), not imported from torch, so the audit works
  without torch and does not change when the installed torch does;
  ``tests/test_security.py`` checks it against the installed torch.
* ``"benign"`` – rejected by the weights-only loader but known to be plain
  data (each entry says why and where it is seen), or listed by the team in
  ``security.allow_globals`` (``extra_allowed``).  Reported as a warning with
  the exact ``torch.serialization.add_safe_globals([...])`` repair.
* ``"dangerous"`` – a label for imports that run commands, code, file or
  network operations when called (public lists: picklescan 1.0.5
  ``scanner._unsafe_globals``, ModelScan ``settings.py`` unsafe globals,
  fickling's "unsafe imports" analysis).  A denylist is always incomplete —
  new gadgets are found every year and scanners are bypassed through
  unlisted modules — so this label only chooses the wording of the finding:
* ``"unknown"`` – everything else.  It is an error too, because only an
  allowlist is safe.

Dangerous imports cannot be allowlisted through ``extra_allowed`` (torch
itself refuses to allowlist anything from ``sys``, ``os``, ``posix``, ``nt``).

The classification is by name only: torch's weights-only unpickler also
refuses opcodes of protocols above 2 (``STACK_GLOBAL``, ``MEMOIZE``, ...),
which the loader, not this module, reports.

This module imports neither torch nor pickle machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from . import findings
from .findings import Finding
from .pickle_walk import Call, GlobalRef, Instance, WalkResult, normalize_global

__all__ = [
    "BENIGN",
    "DANGEROUS_MODULES",
    "DANGEROUS_NAMES",
    "ImportVerdict",
    "WEIGHTS_ONLY_GLOBALS",
    "classify_import",
    "scan",
]

# ------------------------------------------------------------- weights_only

_WO_SOURCE = "torch 2.13 torch/_weights_only_unpickler.py _get_allowed_globals (default weights_only allowlist)"

_LEGACY_TYPES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")
_STORAGE_ONLY = ("ComplexDouble", "ComplexFloat")  # storage classes without a legacy tensor class
_QUANT_STORAGES = ("QInt32", "QInt8", "QUInt2x4", "QUInt4x2", "QUInt8")  # CPU only
_SPARSE_TYPES = ("BFloat16", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
_DTYPES = (
    # torch/storage.py _dtype_to_storage_type_map
    "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool", "bfloat16",
    "complex128", "complex64", "qint8", "qint32", "quint8", "quint4x2", "quint2x4",
    # torch/storage.py _new_dtypes
    "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "complex32",
    "uint16", "uint32", "uint64",
    # sub-byte integer dtypes added explicitly in _get_allowed_globals
    *(f"uint{i}" for i in range(1, 8)), *(f"int{i}" for i in range(1, 8)),
)
_REBUILDS = (  # _tensor_rebuild_functions
    "_rebuild_parameter", "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_tensor",
    "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_sparse_tensor", "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor", "_rebuild_wrapper_subclass", "_rebuild_device_tensor_from_numpy",
    "_rebuild_device_tensor_from_cpu_tensor",
)

#: Every ``module.name`` torch 2.13's ``torch.load(weights_only=True)`` accepts by default.
WEIGHTS_ONLY_GLOBALS: frozenset = frozenset(
    [
        "collections.OrderedDict", "collections.Counter", "torch.nn.parameter.Parameter",
        "torch.serialization._get_layout", "torch.Size", "torch.Tensor", "torch.device",
        "_codecs.encode", "builtins.bytearray", "builtins.set", "builtins.complex",
        "torch._tensor._rebuild_from_type_v2",
        "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
        "torch.per_tensor_affine", "torch.per_tensor_symmetric", "torch.per_channel_affine",
        "torch.per_channel_symmetric", "torch.per_channel_affine_float_qparams",
    ]
    + [f"torch.{d}" for d in _DTYPES]
    + [f"torch._utils.{f}" for f in _REBUILDS]
    + [f"torch.{t}Tensor" for t in _LEGACY_TYPES]  # torch._tensor_classes
    + [f"torch.cuda.{t}Tensor" for t in _LEGACY_TYPES]
    + [f"torch.sparse.{t}Tensor" for t in _SPARSE_TYPES]
    + [f"torch.cuda.sparse.{t}Tensor" for t in _SPARSE_TYPES]
    + [f"torch.{t}Storage" for t in _LEGACY_TYPES + _STORAGE_ONLY + _QUANT_STORAGES]  # torch._storage_classes
    + [f"torch.cuda.{t}Storage" for t in _LEGACY_TYPES + _STORAGE_ONLY]
)

# torch/_weights_only_unpickler.py _read_global_instruction rewrites Python 2
# names with this subset of the stdlib table (torch/_utils.py IMPORT_MAPPING,
# NAME_MAPPING) before looking them up.
_TORCH_IMPORT_MAPPING = {
    "__builtin__": "builtins", "copy_reg": "copyreg", "Queue": "queue", "repr": "reprlib",
    "_abcoll": "collections.abc", "UserDict": "collections", "UserList": "collections",
    "UserString": "collections", "whichdb": "dbm", "StringIO": "io", "cStringIO": "io",
}
_TORCH_NAME_MAPPING = {
    ("__builtin__", "xrange"): ("builtins", "range"), ("__builtin__", "reduce"): ("functools", "reduce"),
    ("__builtin__", "intern"): ("sys", "intern"), ("__builtin__", "unichr"): ("builtins", "chr"),
    ("__builtin__", "unicode"): ("builtins", "str"), ("__builtin__", "long"): ("builtins", "int"),
    ("itertools", "izip"): ("builtins", "zip"), ("itertools", "imap"): ("builtins", "map"),
    ("itertools", "ifilter"): ("builtins", "filter"), ("itertools", "ifilterfalse"): ("itertools", "filterfalse"),
    ("itertools", "izip_longest"): ("itertools", "zip_longest"),
    ("UserDict", "IterableUserDict"): ("collections", "UserDict"),
    ("UserList", "UserList"): ("collections", "UserList"),
    ("UserString", "UserString"): ("collections", "UserString"), ("__builtin__", "basestring"): ("builtins", "str"),
    ("exceptions", "StandardError"): ("builtins", "Exception"), ("UserDict", "UserDict"): ("collections", "UserDict"),
}
# torch refuses these modules even when a user allowlists something from them.
_TORCH_BLOCKED_MODULES = ("sys", "os", "posix", "nt")


def _torch_name(module: str, name: str) -> str:
    if (module, name) in _TORCH_NAME_MAPPING:
        module, name = _TORCH_NAME_MAPPING[(module, name)]
    else:
        module = _TORCH_IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


# ------------------------------------------------------------------ benign


@dataclass(frozen=True)
class _Benign:
    source: str
    add_safe: str  # a Python expression for torch.serialization.add_safe_globals([...])


def _plain(spelling: str, source: str) -> _Benign:
    return _Benign(source, spelling)


def _aliased(target: str, pickled: str, source: str) -> _Benign:
    # (obj, "pickled.name") form: torch matches the name in the file, not obj.__module__
    return _Benign(source, f'({target}, "{pickled}")')


_NUMPY_SRC = ("numpy scalar/array/dtype reconstruction from bytes and a dtype code; calls no user code "
              "(seen for metrics like best_val_loss saved as numpy.float64; picklescan 1.0.5 treats "
              "numpy.dtype/ndarray/_reconstruct as safe)")
_LIGHTNING_SRC = ("Lightning hparams container, a dict subclass with attribute access and no __setstate__ "
                  "(seen as hyper_parameters in Lightning checkpoints). torch 2.13 allows SETITEM(S) only on "
                  "exact dict/OrderedDict/Counter (_weights_only_unpickler.py _check_set_item_target), so "
                  "allowlisting the class itself still fails: the repair maps the name to dict and loads "
                  "the hparams as a plain dict")
_HF_SRC = ("Hugging Face transformers training arguments: a dataclass whose fields are data (numbers, "
           "strings, enums), rebuilt with __dict__.update; saved as training_args.bin by Trainer")
_HF_ENUM_SRC = "Hugging Face transformers enum pickled inside TrainingArguments; rebuilt as cls(value)"
_DCP_SRC = ("torch.distributed.checkpoint dataclass/enum that FileSystemWriter pickles into .metadata "
            "(torch/distributed/checkpoint/metadata.py, filesystem.py); its fields are sizes, offsets, dtypes, "
            "names")
_BUILTIN_SRC = "Python built-in data type; calling it builds a value and runs no code named by the pickle"

#: Known-benign imports: ``module.name`` → why, and the add_safe_globals spelling.
BENIGN: Dict[str, _Benign] = {
    "argparse.Namespace": _plain("argparse.Namespace", "argparse attribute bag of plain values (fairseq and "
                                 "Megatron-LM save their training args as a Namespace)"),
    "numpy.core.multiarray.scalar": _aliased("numpy.core.multiarray.scalar", "numpy.core.multiarray.scalar",
                                             _NUMPY_SRC + "; numpy 1.x name, aliased because under numpy 2 the "
                                             "function reports module numpy._core.multiarray"),
    "numpy._core.multiarray.scalar": _plain("numpy._core.multiarray.scalar", _NUMPY_SRC),
    "numpy.core.multiarray._reconstruct": _aliased(
        "numpy.core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", _NUMPY_SRC + "; numpy 1.x name"),
    "numpy._core.multiarray._reconstruct": _plain("numpy._core.multiarray._reconstruct", _NUMPY_SRC),
    "numpy.dtype": _plain("numpy.dtype", _NUMPY_SRC + "; the DType class of each dtype code is added to the "
                          "repair because torch's BUILD check needs it"),
    "numpy.ndarray": _plain("numpy.ndarray", _NUMPY_SRC),
    "torch.torch_version.TorchVersion": _plain("torch.torch_version.TorchVersion",
                                               "str subclass holding torch.__version__ (saved when a script stores "
                                               "torch.__version__ as is)"),
    "pytorch_lightning.utilities.parsing.AttributeDict": _aliased(
        "dict", "pytorch_lightning.utilities.parsing.AttributeDict", _LIGHTNING_SRC),
    "lightning.fabric.utilities.data.AttributeDict": _aliased(
        "dict", "lightning.fabric.utilities.data.AttributeDict", _LIGHTNING_SRC),
    "lightning.pytorch.utilities.parsing.AttributeDict": _aliased(
        "dict", "lightning.pytorch.utilities.parsing.AttributeDict", _LIGHTNING_SRC),
    "pathlib.PosixPath": _aliased("pathlib.PosixPath", "pathlib.PosixPath",
                                  "filesystem path value (output_dir, data paths in saved configs); aliased "
                                  "because Python 3.13 moved it to pathlib._local"),
    "pathlib.WindowsPath": _aliased("pathlib.WindowsPath", "pathlib.WindowsPath",
                                    "filesystem path value saved on Windows; aliased as PosixPath"),
    "pathlib.PurePosixPath": _aliased("pathlib.PurePosixPath", "pathlib.PurePosixPath", "pure path value"),
    "pathlib.PureWindowsPath": _aliased("pathlib.PureWindowsPath", "pathlib.PureWindowsPath", "pure path value"),
    "datetime.datetime": _plain("datetime.datetime", "timestamp value rebuilt from bytes (save time in metadata)"),
    "datetime.date": _plain("datetime.date", "date value rebuilt from bytes"),
    "datetime.time": _plain("datetime.time", "time value rebuilt from bytes"),
    "datetime.timedelta": _plain("datetime.timedelta", "duration value (elapsed training time)"),
    "datetime.timezone": _plain("datetime.timezone", "fixed-offset tzinfo of an aware datetime"),
    "transformers.training_args.TrainingArguments": _plain("transformers.training_args.TrainingArguments", _HF_SRC),
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments": _plain(
        "transformers.training_args_seq2seq.Seq2SeqTrainingArguments", _HF_SRC),
    "transformers.training_args.OptimizerNames": _plain("transformers.training_args.OptimizerNames", _HF_ENUM_SRC),
    "transformers.trainer_utils.IntervalStrategy": _plain("transformers.trainer_utils.IntervalStrategy", _HF_ENUM_SRC),
    "transformers.trainer_utils.SaveStrategy": _plain("transformers.trainer_utils.SaveStrategy", _HF_ENUM_SRC),
    "transformers.trainer_utils.HubStrategy": _plain("transformers.trainer_utils.HubStrategy", _HF_ENUM_SRC),
    "transformers.trainer_utils.SchedulerType": _plain("transformers.trainer_utils.SchedulerType", _HF_ENUM_SRC),
    "transformers.trainer_utils.FSDPOption": _plain("transformers.trainer_utils.FSDPOption", _HF_ENUM_SRC),
    "transformers.debug_utils.DebugOption": _plain("transformers.debug_utils.DebugOption", _HF_ENUM_SRC),
    # framework data classes seen in the real-framework fixtures (tests/frameworks), each rebuilt from
    # constants with NEWOBJ/REDUCE + BUILD; the version is the one they were seen in
    "transformers.trainer_pt_utils.AcceleratorConfig": _plain(
        "transformers.trainer_pt_utils.AcceleratorConfig", _HF_SRC + " (accelerator_config field; transformers 5.24.0)"),
    "accelerate.state.PartialState": _plain(
        "accelerate.state.PartialState", "accelerate process-state holder pickled inside TrainingArguments "
        "(distributed_state field), rebuilt without calling __init__; accelerate 1.15.0, transformers 5.24.0"),
    "accelerate.utils.dataclasses.DistributedType": _plain(
        "accelerate.utils.dataclasses.DistributedType", "accelerate enum (NO, MULTI_GPU, DEEPSPEED…) pickled "
        "inside TrainingArguments; accelerate 1.15.0"),
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": _plain(
        "deepspeed.runtime.fp16.loss_scaler.LossScaler", "DeepSpeed static loss-scaler state (cur_scale, "
        "dynamic=False) in ZeRO optim_states files; deepspeed 0.19.8"),
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": _plain(
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", "DeepSpeed dynamic loss-scaler state (cur_scale, "
        "scale_window, hysteresis counters) in fp16 ZeRO optim_states files; deepspeed 0.19.8"),
    "deepspeed.runtime.zero.config.ZeroStageEnum": _plain(
        "deepspeed.runtime.zero.config.ZeroStageEnum", "DeepSpeed ZeRO stage enum in optim_states files; "
        "deepspeed 0.19.8"),
    "deepspeed.utils.tensor_fragment.fragment_address": _plain(
        "deepspeed.utils.tensor_fragment.fragment_address", "DeepSpeed dataclass (numel, start) of a parameter's "
        "slice in a flat ZeRO partition (param_slice_mappings); deepspeed 0.19.8"),
    **{f"builtins.{t}": _plain(t, _BUILTIN_SRC)
       for t in ("dict", "list", "tuple", "int", "float", "str", "bool", "bytes", "frozenset", "slice", "range")},
    **{f"torch.distributed.checkpoint.metadata.{t}": _plain(f"torch.distributed.checkpoint.metadata.{t}", _DCP_SRC)
       for t in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "TensorProperties", "_MEM_FORMAT_ENCODING", "MetadataIndex", "StorageMeta")},
    **{f"torch.distributed.checkpoint.filesystem.{t}": _plain(f"torch.distributed.checkpoint.filesystem.{t}",
                                                              _DCP_SRC)
       for t in ("_StorageInfo", "_StoragePrefix")},
}
# collections.defaultdict is deliberately NOT benign: its pickle carries a
# default_factory, an arbitrary callable that is stored and called on every
# missing-key lookup after loading, and torch 2.13 cannot load it weights-only
# even when allowlisted (SETITEM on a dict subclass is refused), so no
# add_safe_globals repair exists.  It is reported as unknown.

_NUMPY_DTYPES_SRC = "numpy.dtypes DType class (numpy >= 1.25), a dtype's own type"

# numpy dtype code (first argument of numpy.dtype in its pickle) → numpy.dtypes class;
# from type(numpy.dtype(code)) under numpy 2.x.
_NUMPY_DTYPE_CLASS = {
    "b1": "BoolDType", "i1": "Int8DType", "i2": "Int16DType", "i4": "Int32DType", "i8": "Int64DType",
    "u1": "UInt8DType", "u2": "UInt16DType", "u4": "UInt32DType", "u8": "UInt64DType",
    "f2": "Float16DType", "f4": "Float32DType", "f8": "Float64DType", "f12": "LongDoubleDType",
    "f16": "LongDoubleDType", "c8": "Complex64DType", "c16": "Complex128DType", "c24": "CLongDoubleDType",
    "c32": "CLongDoubleDType", "O4": "ObjectDType", "O8": "ObjectDType", "M8": "DateTime64DType",
    "m8": "TimeDelta64DType",
}
_NUMPY_DTYPE_PREFIX = {"S": "BytesDType", "U": "StrDType", "V": "VoidDType"}

# ---------------------------------------------------------------- dangerous

_PS = "picklescan 1.0.5 _unsafe_globals"
_MS = "ModelScan settings unsafe_globals"

#: Modules every name of which is labelled dangerous (submodules included).
DANGEROUS_MODULES: Dict[str, str] = {
    "os": f"process/file control (os.system, os.popen, os.exec*); {_PS}, {_MS}",
    "posix": f"os on Linux/macOS (pickle records os.system as posix.system); {_PS}, {_MS}",
    "nt": f"os on Windows; {_PS}, {_MS}",
    "subprocess": f"runs commands; {_PS}, {_MS}",
    "_posixsubprocess": "fork_exec primitive under subprocess",
    "sys": f"interpreter internals (sys.modules patching); {_PS}",
    "socket": f"network access; {_PS}, {_MS}",
    "ssl": f"network access (DNS exfiltration via get_server_certificate); {_PS}",
    "httplib": f"network access (Python 2); {_PS}, {_MS}",
    "http.client": "network access",
    "urllib.request": f"network access; {_PS}",
    "urllib2": "network access (Python 2)",
    "requests": f"network access; {_PS} (requests.api), {_MS}",
    "aiohttp": f"network access; {_PS}, {_MS}",
    "shutil": f"file deletion/copy; {_PS}, {_MS}",
    "runpy": f"runs modules/code; {_PS}, {_MS}",
    "importlib": "imports arbitrary modules (import_module)",
    "imp": "imports arbitrary modules (Python < 3.12)",
    "zipimport": "loads modules from archives",
    "pickle": f"nested unpickling (pickle.loads); {_PS}, {_MS}",
    "_pickle": f"nested unpickling; {_PS}",
    "marshal": "loads code objects",
    "code": f"interactive interpreter that runs source (InteractiveInterpreter.runcode); {_PS}",
    "pty": f"pty.spawn runs commands; {_PS}, {_MS}",
    "ctypes": f"foreign function calls and raw memory; {_PS}",
    "_ctypes": "foreign function calls and raw memory",
    "webbrowser": f"opens URLs/launches programs; {_PS}, {_MS}",
    "pydoc": f"pydoc.locate imports anything, pipepager runs commands; {_PS}",
    "timeit": f"timeit runs source strings; {_PS}",
    "cProfile": f"run/runctx exec source strings; {_PS}",
    "profile": f"run/runctx exec source strings; {_PS}",
    "pdb": f"debugger runs source strings; {_PS}, {_MS}",
    "bdb": f"debugger base runs source strings; {_PS}, {_MS}",
    "trace": f"Trace.run/runctx exec source strings; {_PS}",
    "multiprocessing": "starts processes",
    "asyncio": f"asyncio.subprocess / create_subprocess_shell run commands; {_PS}, {_MS}",
    "commands": f"Python 2 precursor of subprocess; {_PS}",
    "popen2": "Python 2 command runner",
    "pip": f"installs and runs packages; {_PS}",
    "ensurepip": f"runs pip; {_PS}",
    "venv": f"creates environments, runs pip; {_PS}",
    "distutils": f"spawn/write_file; {_PS} (distutils.file_util)",
    "idlelib": f"IDLE runs source (runcode, fetch_completions); {_PS}",
    "lib2to3": f"grammar loaders unpickle/eval; {_PS}",
    "test": f"test.support.script_helper spawns interpreters; {_PS}",
    "uuid": f"uuid._get_command_stdout runs commands; {_PS}",
    "_osx_support": f"runs build tools via os.system; {_PS}",
    "_aix_support": f"runs commands via os.system; {_PS}",
    "_pyrepl": f"pager runs commands; {_PS}",
    "cloudpickle": f"rebuilds functions from code objects (_make_function, subimport); {_PS}",
    "dill": "rebuilds functions and code objects from the pickle",
    "numpy.f2py": f"calls eval on strings; {_PS}",
    "numpy.testing._private.utils": f"runstring is exec; {_PS}",
    "torch.hub": "downloads and runs repository code (torch.hub.load)",
    "torch._inductor.codecache": f"compiles and runs code (compile_file); {_PS}",
    "torch.utils.cpp_extension": "compiles and loads native extensions",
    "torch.utils.bottleneck": f"runs profiled scripts; {_PS}",
    "torch.utils.collect_env": f"run() executes commands; {_PS}",
    "torch._dynamo.guards": f"guard code evaluation (GuardBuilder.get); {_PS}",
}

#: Single names labelled dangerous inside otherwise ordinary modules.
DANGEROUS_NAMES: Dict[str, str] = {
    **{f"builtins.{n}": f"built-in that runs, imports or reaches arbitrary code/files; {_PS}, {_MS}"
       for n in ("eval", "exec", "execfile", "compile", "__import__", "getattr", "setattr", "delattr",
                 "open", "breakpoint", "input", "globals", "locals", "vars", "apply", "file", "reload",
                 "help")},
    "operator.attrgetter": f"attribute-walking gadget (attrgetter('system')(os)); {_PS}",
    "operator.methodcaller": f"calls any method by name; {_PS}",
    "operator.itemgetter": f"item-walking gadget; {_PS}",
    "_operator.attrgetter": f"attribute-walking gadget; {_PS}",
    "_operator.methodcaller": f"calls any method by name; {_PS}",
    "_operator.itemgetter": f"item-walking gadget; {_PS}",
    "functools.partial": f"binds arguments to any callable (partial(os.system, cmd)); {_PS}",
    "functools.reduce": "calls any callable repeatedly",
    "_functools.partial": "binds arguments to any callable",
    "_functools.reduce": "calls any callable repeatedly",
    "pkgutil.resolve_name": f"resolves any 'module:attr', bypassing name-based lists; {_PS}",
    "types.CodeType": f"builds code objects; {_PS}",
    "types.FunctionType": "builds functions from code objects",
    "_io.FileIO": f"opens files, bypassing builtins.open lists; {_PS}",
    "io.FileIO": "opens files",
    "io.open": "opens files",
    "_io.open": "opens files",
    "logging.FileHandler": f"creates files; {_PS}",
    "doctest.debug_script": f"runs source; {_PS}",
    "imaplib.IMAP4_stream": f"runs a command through a shell; {_PS}",
    "torch.serialization.load": f"loads another (unchecked) pickle; {_PS}",
    "torch.load": "loads another (unchecked) pickle",
    "torch.fx.experimental.symbolic_shapes.ShapeEnv": f"evaluate_guards_expression evals strings; {_PS}",
    "torch.jit.unsupported_tensor_ops.execWrapper": f"exec wrapper; {_PS}",
    "torch.utils._config_module.ConfigModule": f"load_config unpickles nested data; {_PS}",
    "torch.utils.data.datapipes.utils.decoder.basichandlers": f"unpickles nested data; {_PS}",
    "torch.storage._load_from_bytes": "runs torch.load(weights_only=False) on embedded bytes",
    "numpy.load": "numpy.load(allow_pickle=True) unpickles another file",
    "numpy.lib.npyio.load": "unpickles another file",
    "joblib.load": "unpickles another file",
    "pandas.read_pickle": "unpickles another file",
    "copyreg._extension_registry": "import by extension code: the name is not in the file",
}


@dataclass
class ImportVerdict:
    """How one imported ``module.name`` is classified, and on what grounds.

    ``category`` is ``weights_only``, ``benign``, ``dangerous`` or
    ``unknown``; ``source`` says where the classification comes from;
    ``add_safe`` (benign only) is the expression to pass to
    ``torch.serialization.add_safe_globals([...])``.
    """

    module: str
    name: str
    category: str
    source: str
    add_safe: str = ""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


def _dangerous(module: str, name: str) -> Optional[str]:
    for mod, nm in ((module, name), normalize_global(module, name)):
        full = f"{mod}.{nm}"
        if full in DANGEROUS_NAMES:
            return DANGEROUS_NAMES[full]
        first = f"{mod}.{nm.split('.', 1)[0]}"  # dotted qualname: Class.method
        if first in DANGEROUS_NAMES:
            return DANGEROUS_NAMES[first]
        parts = mod.split(".")
        for i in range(len(parts), 0, -1):
            src = DANGEROUS_MODULES.get(".".join(parts[:i]))
            if src is not None:
                return src
    return None


def classify_import(module: str, name: str, extra_allowed: Sequence[str] = ()) -> ImportVerdict:
    """Classify one import (names as written in the pickle).

    Order: dangerous (cannot be overridden), torch's weights-only default
    allowlist, the team's ``extra_allowed`` (``"pkg.mod.Name"`` strings),
    the known-benign table, else unknown.
    """
    src = _dangerous(module, name)
    if src is not None:
        return ImportVerdict(module, name, "dangerous", src)
    full = f"{module}.{name}"
    tname = _torch_name(module, name)
    if tname in WEIGHTS_ONLY_GLOBALS and module not in _TORCH_BLOCKED_MODULES:
        return ImportVerdict(module, name, "weights_only", _WO_SOURCE)
    if full in extra_allowed or tname in extra_allowed:
        return ImportVerdict(module, name, "benign", "security.allow_globals in the audit config",
                             _spelling(module, name))
    b = BENIGN.get(tname) or BENIGN.get(full)
    if b is not None:
        return ImportVerdict(module, name, "benign", b.source, b.add_safe)
    if module == "numpy.dtypes" and name.endswith("DType") and name.isidentifier():
        return ImportVerdict(module, name, "benign", _NUMPY_DTYPES_SRC, f"numpy.dtypes.{name}")
    return ImportVerdict(module, name, "unknown", "not in torch's weights-only allowlist nor the benign list")


def _spelling(module: str, name: str) -> str:
    """Python expression naming ``module.name`` for add_safe_globals.

    torch matches allowlisted objects by ``obj.__module__ + "." + obj.__qualname__``
    against the name in the file after its own Python 2 mapping; when the
    importable Python 3 object lives elsewhere, the ``(obj, "name")`` form is
    needed.  Built-ins are spelled bare, as torch's own error message does.
    """
    target = _torch_name(module, name)
    mod, nm = normalize_global(module, name)
    expr = nm if mod == "builtins" else f"{mod}.{nm}"
    if f"{mod}.{nm}" != target:
        return f'({expr}, "{target}")'
    return expr


# -------------------------------------------------------------------- scan


def _nodes(obj: Any, max_nodes: int = 2_000_000) -> Iterator[Any]:
    """Every value reachable from ``obj`` (each container once), bounded."""
    todo = [obj]
    seen = set()
    n = 0
    while todo and n < max_nodes:
        x = todo.pop()
        n += 1
        yield x
        t = type(x)
        if t in (dict, list, tuple, set, frozenset) or isinstance(x, dict):
            if id(x) in seen:
                continue
            seen.add(id(x))
            if isinstance(x, dict):
                todo.extend(x.keys())
                todo.extend(x.values())
            else:
                todo.extend(x)
        elif t is Instance or t is Call:
            if id(x) in seen:
                continue
            seen.add(id(x))
            todo.append(x.cls if t is Instance else x.func)
            todo.extend(x.args)
            todo.append(x.state)
            todo.append(x.items)


def _numpy_dtype_classes(result: WalkResult) -> List[str]:
    """numpy.dtypes.*DType classes that torch's BUILD check will meet for numpy.dtype objects."""
    out = set()
    results = [result]
    while results:
        r = results.pop()
        results.extend(r.nested)
        for x in _nodes(r.obj):
            if type(x) is not Instance or type(x.cls) is not GlobalRef:
                continue
            if "%s.%s" % normalize_global(x.cls.module, x.cls.name) != "numpy.dtype":
                continue
            code = x.args[0] if x.args and type(x.args[0]) is str else None
            if code is None:
                continue
            cls = _NUMPY_DTYPE_CLASS.get(code) or _NUMPY_DTYPE_PREFIX.get(code[:1])
            if cls:
                out.add(f"numpy.dtypes.{cls}")
    return sorted(out)


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in sorted(set(names)))


def scan(result: WalkResult, *, path: str, member: str, extra_allowed: Sequence[str] = (),
         loader: str = "auto") -> Tuple[List[ImportVerdict], List[Finding]]:
    """Classify every import of ``result`` (and of its nested pickles); make findings.

    Returns one :class:`ImportVerdict` per distinct import, in order of first
    appearance, and at most one finding per kind for this ``member``:
    ``malicious_pickle_code_exec`` (dangerous), ``unknown_pickle_global``,
    ``non_allowlisted_global_benign`` (with the ``add_safe_globals`` repair) and
    ``pickle_obfuscation`` (the walk's tricks).  Each names every import of
    its category, sorted and quoted.

    ``loader`` says what reads this member: ``"torch.load"`` (weights-only by
    default since torch 2.6, so benign imports need the repair) or
    ``"pickle.load"`` (no allowlist exists, e.g. DCP's
    ``FileSystemReader.read_metadata``: benign imports need nothing and get no
    finding; dangerous and unknown ones are still errors).  ``"auto"`` picks
    ``"pickle.load"`` for a member named ``.metadata`` and ``"torch.load"``
    otherwise.
    """
    if loader == "auto":
        loader = "pickle.load" if member.replace("\\", "/").rsplit("/", 1)[-1] == ".metadata" else "torch.load"
    verdicts: List[ImportVerdict] = []
    seen = set()
    for g in result.all_globals():
        key = (g.module, g.name, g.literal)
        if key in seen:
            continue
        seen.add(key)
        if not g.literal:
            src = ("import by extension-registry code; the name is not in the file" if g.opcode.startswith("EXT")
                   else "name computed while unpickling (STACK_GLOBAL of non-literal operands)")
            verdicts.append(ImportVerdict(g.module, g.name, "unknown", src))
        else:
            verdicts.append(classify_import(g.module, g.name, extra_allowed))

    by_cat: Dict[str, List[ImportVerdict]] = {}
    for v in verdicts:
        by_cat.setdefault(v.category, []).append(v)
    out: List[Finding] = []
    if "dangerous" in by_cat:
        names = [v.qualname for v in by_cat["dangerous"]]
        out.append(findings.make("malicious_pickle_code_exec", path=path, member=member,
                                 dangerous=_quoted(names), imports=sorted(set(names))))
    if "unknown" in by_cat:
        names = [v.qualname for v in by_cat["unknown"]]
        out.append(findings.make("unknown_pickle_global", path=path, member=member,
                                 unknown=_quoted(names), imports=sorted(set(names))))
    if "benign" in by_cat and loader == "torch.load":
        names = [v.qualname for v in by_cat["benign"]]
        spellings = {v.add_safe for v in by_cat["benign"]}
        if any(v.qualname == "numpy.dtype" or normalize_global(v.module, v.name) == ("numpy", "dtype")
               for v in by_cat["benign"]):
            spellings.update(_numpy_dtype_classes(result))
        out.append(findings.make("non_allowlisted_global_benign", path=path, member=member,
                                 benign=_quoted(names), add_safe=", ".join(sorted(spellings)),
                                 imports=sorted(set(names))))
    tricks = result.all_tricks()
    if tricks:
        why = "; ".join(tricks[:5]) + (f"; and {len(tricks) - 5} more" if len(tricks) > 5 else "")
        out.append(findings.make("pickle_obfuscation", path=path, member=member, why=why, tricks=tricks))
    return verdicts, out
