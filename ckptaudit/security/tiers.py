"""The data of the security tiers: what each imported ``module.name`` can do when a pickle calls it.

The allowlists, each with its sources (:mod:`ckptaudit.security` uses them; the dangerous tier is in
:mod:`ckptaudit.security.dangers`):

* :data:`WEIGHTS_ONLY_GLOBALS` – what torch 2.13's ``torch.load(weights_only=True)``
  accepts by default (``torch/_weights_only_unpickler.py``);
* :data:`BENIGN` – data classes of known frameworks (transformers, accelerate,
  deepspeed, lightning, omegaconf, numpy, DCP, the standard library), each
  entry with where and in which version it was seen pickled;
* :data:`IN_MEMORY_BUFFERS` – the ``_io`` module's buffers, which leave that module's dangerous tier.

Data only: nothing here imports what it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from .. import producers

# ------------------------------------------------------------- weights_only

#: Where the weights-only tier comes from.
WO_SOURCE = "torch 2.13 torch/_weights_only_unpickler.py _get_allowed_globals (default weights_only allowlist)"

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
TORCH_BLOCKED_MODULES = ("sys", "os", "posix", "nt")


def torch_name(module: str, name: str) -> str:
    """The name torch's weights-only unpickler looks ``module.name`` up under (its Python 2 and alias spellings mapped)."""
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
_DCP_SRC = ("torch.distributed.checkpoint dataclass/enum that FileSystemWriter pickles into .metadata "
            "(torch/distributed/checkpoint/metadata.py, filesystem.py); its fields are sizes, offsets, dtypes, "
            "names")
_DCP_PLAN_SRC = ("torch.distributed.checkpoint save-plan dataclass/enum (torch 2.13 torch/distributed/checkpoint/"
                 "planner.py:34 WriteItemType, :46 BytesIOWriteData, :51 TensorWriteData, :58 WriteItem, :105 "
                 "SavePlan): frozen dataclasses without __reduce__/__setstate__, so pickle rebuilds them with NEWOBJ "
                 "(cls.__new__) and BUILD (their __dict__ filled with the saved fields: indices, chunk offsets and "
                 "sizes, dtypes); the enum is rebuilt by value; no code of theirs runs.  Megatron-Core stores its "
                 "cached save plans in .metadata as global_metadata.all_local_plans (megatron-core 0.16.1 "
                 "dist_checkpointing/strategies/state_dict_saver.py:144), so every torch_dist .metadata pickles them")
_OMEGACONF_SRC = ("omegaconf config node (DictConfig/ListConfig/value node and their metadata), rebuilt with "
                  "NEWOBJ + BUILD of its state; holds config values only")
_BUILTIN_SRC = "Python built-in data type; calling it builds a value and runs no code named by the pickle"

_BUFFER_SRC = ("built empty by NEWOBJ and filled by __setstate__ from a (value, position, dict) tuple; no file "
               "or callable involved (CPython Modules/_io/{}.c). dcp.save writes a non-tensor value that is a "
               "buffer so (torchtitan's TrainState keeps its loss history in one; tests/frameworks/fw_fsdp_dcp.py, "
               "torch 2.13)")
#: The ``_io`` module's in-memory buffers: the only names of that module (whose others open files) that are
#: data.  :func:`ckptaudit.security.classify_import` takes them out of the dangerous module's tier.
IN_MEMORY_BUFFERS: Dict[str, str] = {
    "_io.BytesIO": "in-memory byte buffer, " + _BUFFER_SRC.format("bytesio"),
    "_io.StringIO": "in-memory text buffer, " + _BUFFER_SRC.format("stringio"),
}

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
    # the frameworks' own data classes (each producer's module: ckptaudit.producers), rebuilt from constants
    **{name: _Benign(why, spelling) for p in producers.PRODUCERS for name, (spelling, why) in p.benign_globals.items()},
    # omegaconf containers (Hydra configs saved as Lightning hyper_parameters): rebuilt with
    # NEWOBJ + BUILD of a state dict (_content, _metadata, _parent); their __setstate__ stores data
    # and calls no name from the pickle. Seen in pesto-pitch 2.0.1 mir-1k_g7.ckpt (omegaconf 2.x).
    **{f"omegaconf.{m}.{c}": _plain(f"omegaconf.{m}.{c}", _OMEGACONF_SRC)
       for m, c in (("dictconfig", "DictConfig"), ("listconfig", "ListConfig"), ("base", "ContainerMetadata"),
                    ("base", "Metadata"), ("nodes", "AnyNode"), ("nodes", "StringNode"), ("nodes", "IntegerNode"),
                    ("nodes", "FloatNode"), ("nodes", "BooleanNode"), ("nodes", "ValueNode"))},
    "typing.Any": _plain("typing.Any", "the typing.Any marker object, referenced (not called) as the element "
                         "and key type of omegaconf containers; pesto-pitch 2.0.1 mir-1k_g7.ckpt"),
    "collections.defaultdict": _plain(
        "collections.defaultdict", "dict subclass; its default_factory is a callable stored and called on "
        "each missing key, so it is data only when that factory is a built-in type or None, which the "
        "scan checks on every instance (pesto-pitch 2.0.1 mir-1k_g7.ckpt: factory __builtin__.dict)"),
    **{f"builtins.{t}": _plain(t, _BUILTIN_SRC)
       for t in ("dict", "list", "tuple", "int", "float", "str", "bool", "bytes", "frozenset", "slice", "range")},
    **{f"torch.distributed.checkpoint.metadata.{t}": _plain(f"torch.distributed.checkpoint.metadata.{t}", _DCP_SRC)
       for t in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "TensorProperties", "_MEM_FORMAT_ENCODING", "MetadataIndex", "StorageMeta")},
    **{f"torch.distributed.checkpoint.filesystem.{t}": _plain(f"torch.distributed.checkpoint.filesystem.{t}",
                                                              _DCP_SRC)
       for t in ("_StorageInfo", "_StoragePrefix")},
    **{f"torch.distributed.checkpoint.planner.{t}": _plain(f"torch.distributed.checkpoint.planner.{t}", _DCP_PLAN_SRC)
       for t in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData")},
    **{name: _plain(name.replace("_io.", "io.", 1), src) for name, src in IN_MEMORY_BUFFERS.items()},
}

#: Where the numpy dtype classes in the benign tier come from.
NUMPY_DTYPES_SRC = "numpy.dtypes DType class (numpy >= 1.25), a dtype's own type"

# numpy dtype code (first argument of numpy.dtype in its pickle) → numpy.dtypes class;
# from type(numpy.dtype(code)) under numpy 2.x.
NUMPY_DTYPE_CLASS = {
    "b1": "BoolDType", "i1": "Int8DType", "i2": "Int16DType", "i4": "Int32DType", "i8": "Int64DType",
    "u1": "UInt8DType", "u2": "UInt16DType", "u4": "UInt32DType", "u8": "UInt64DType",
    "f2": "Float16DType", "f4": "Float32DType", "f8": "Float64DType", "f12": "LongDoubleDType",
    "f16": "LongDoubleDType", "c8": "Complex64DType", "c16": "Complex128DType", "c24": "CLongDoubleDType",
    "c32": "CLongDoubleDType", "O4": "ObjectDType", "O8": "ObjectDType", "M8": "DateTime64DType",
    "m8": "TimeDelta64DType",
}
NUMPY_DTYPE_PREFIX = {"S": "BytesDType", "U": "StrDType", "V": "VoidDType"}
