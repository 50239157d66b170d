"""The data of the security tiers: what each imported ``module.name`` can do when a pickle calls it.

Four tables, each with its sources (:mod:`ckptaudit.security` uses them):

* :data:`WEIGHTS_ONLY_GLOBALS` – what torch 2.13's ``torch.load(weights_only=True)``
  accepts by default (``torch/_weights_only_unpickler.py``);
* :data:`BENIGN` – data classes of known frameworks (transformers, accelerate,
  deepspeed, lightning, omegaconf, numpy, DCP, the standard library), each
  entry with where and in which version it was seen pickled;
* :data:`DANGEROUS_MODULES` / :data:`DANGEROUS_NAMES` – code execution, file,
  process, network and import machinery, attribute-walking gadgets
  (picklescan 1.0.5 ``_unsafe_globals``, ModelScan ``settings.py``, fickling's
  unsafe-imports analysis, and the names the security corpus showed missing);
* :data:`DANGEROUS_METHODS` – method names that make a protocol-4 dotted name
  (``pathlib.Path.write_text``) a file, process or code operation.

Data only: nothing here imports what it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

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
    **{name: _plain(name.replace("_io.", "io.", 1), src) for name, src in IN_MEMORY_BUFFERS.items()},
}

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
        "torch.hub": "downloads and runs repository code (torch.hub.load)",
    "torch._inductor.codecache": f"compiles and runs code (compile_file); {_PS}",
    "torch.utils.cpp_extension": "compiles and loads native extensions",
    "torch.utils.bottleneck": f"runs profiled scripts; {_PS}",
    "torch.utils.collect_env": f"run() executes commands; {_PS}",
    "torch._dynamo.guards": f"guard code evaluation (GuardBuilder.get); {_PS}",
    "numpy.testing": f"numpy.testing._private.utils.runstring is exec; {_PS}",
    "torch._inductor": "compiles and runs code (cpp_builder.run_compile_cmd runs a shell command)",
    "torch.fx.graph_module": "reduce_graph_module execs the Python source it is given (torch 2.13 fx/graph_module.py)",
    "torch.package": "imports code from a package archive",
    "torch.jit": "compiles and runs TorchScript source (torch.jit.load/CompilationUnit)",
    "builtins.__loader__": "the import machinery",
    "_io": "file access (open, FileIO)",
    "tempfile": "creates files",
    "glob": "lists the filesystem",
    "zipfile": "reads and writes archives on disk",
    "tarfile": "extracts archives onto disk (path traversal)",
    "ftplib": "network access",
    "smtplib": "network access",
    "telnetlib": "network access",
    "xmlrpc": "network access",
    "urllib3": "network access",
    "httpx": "network access",
    "signal": "changes process signal handling",
    "resource": "changes process limits",
    "gc": "reaches every live object (gc.get_objects)",
    "inspect": "reaches frames and source of live objects",
    "threading": "starts threads that run any callable",
    "_thread": "starts threads that run any callable",
    "concurrent": "runs callables in pools",
    "sysconfig": "interpreter configuration",
    "site": "changes the import path",
    "builtins.__builtins__": "the built-in namespace",
    "_imp": "import machinery",
    "_frozen_importlib": "import machinery",
    "_frozen_importlib_external": "import machinery",
    "zipimport": "loads modules from archives",
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
    "codecs.open": "opens (creates, truncates) files; on no picklescan 1.0.5 list",
    "codecs.EncodedFile": "wraps a file object for writing",
    "typing._eval_type": "evaluates a ForwardRef, i.e. eval() of a source string",
    "typing.ForwardRef": "holds a source string that typing evaluates with eval()",
    "typing.get_type_hints": "evaluates string annotations with eval()",
    "pathlib.Path": "path object whose methods read, write and delete files (its subclasses PosixPath/WindowsPath "
                    "are the data classes pickles hold; Path itself is only named by crafted pickles)",
    "operator.getitem": "item-walking gadget (getitem(os.environ, ...)); fickling",
    "_operator.getitem": "item-walking gadget",
}

#: Methods that turn a protocol-4 dotted name (``pathlib.Path.write_text``, ``bytes.fromhex`` is not one)
#: into a file, process, code or import operation, whatever the class.
DANGEROUS_METHODS = frozenset({
    "write_text", "write_bytes", "open", "unlink", "rmdir", "rename", "replace", "touch", "mkdir", "symlink_to",
    "hardlink_to", "chmod", "read_text", "read_bytes", "system", "popen", "spawn", "exec", "eval", "run", "call",
    "check_call", "check_output", "load", "loads", "load_config", "runcode", "runsource", "import_module",
    "__import__", "compile", "execfile", "remove", "rmtree", "copyfile", "urlopen", "connect", "Popen",
})

