"""Global names: Python 2 spellings normalised, and the torch and builtin names the walk recognises."""

from __future__ import annotations

from typing import Dict, Tuple

# Python 2 names that the stdlib unpickler rewrites for protocols < 3
# (``fix_imports``; Lib/_compat_pickle.py).  torch's weights-only unpickler
# applies the subset in torch/_utils.py (IMPORT_MAPPING / NAME_MAPPING).
try:  # the stdlib table, when present (CPython)
    import _compat_pickle as _cp

    _NAME_MAPPING: Dict[Tuple[str, str], Tuple[str, str]] = dict(_cp.NAME_MAPPING)
    _IMPORT_MAPPING: Dict[str, str] = dict(_cp.IMPORT_MAPPING)
except ImportError:  # pragma: no cover - other interpreters
    _NAME_MAPPING = {}
    _IMPORT_MAPPING = {"__builtin__": "builtins", "copy_reg": "copyreg"}


def normalize_global(module: str, name: str) -> Tuple[str, str]:
    """Map Python 2 spellings (``__builtin__``, ``copy_reg`` ...) to what would be imported."""
    key = (module, name)
    if key in _NAME_MAPPING:
        return _NAME_MAPPING[key]
    return _IMPORT_MAPPING.get(module, module), name


# ---------------------------------------------------------------- recognised globals

#: torch's rebuild functions a tensor's pickle calls (torch/_utils.py, torch/_tensor.py), by version.
R_TENSOR_V2 = "torch._utils._rebuild_tensor_v2"
R_TENSOR = "torch._utils._rebuild_tensor"
R_TENSOR_V3 = "torch._utils._rebuild_tensor_v3"
R_QTENSOR = "torch._utils._rebuild_qtensor"
R_PARAM = "torch._utils._rebuild_parameter"
R_PARAM_STATE = "torch._utils._rebuild_parameter_with_state"
R_FROM_TYPE = "torch._tensor._rebuild_from_type_v2"
#: The classes a parameter is pickled as.
PARAMETER_CLASSES = {"torch.nn.parameter.Parameter", "torch.nn.Parameter"}
#: Every rebuild the walk turns into a :class:`TensorMeta`.
TENSOR_REBUILDS = {R_TENSOR_V2, R_TENSOR, R_TENSOR_V3, R_QTENSOR, R_PARAM, R_PARAM_STATE, R_FROM_TYPE}

# Lower-case globals that are classes anyway (so REDUCE of them is an Instance).
KNOWN_CLASSES = {
    "numpy.dtype", "numpy.ndarray", "datetime.datetime", "datetime.date", "datetime.time",
    "datetime.timedelta", "datetime.timezone", "torch.device", "collections.defaultdict",
    "collections.deque", "collections.OrderedDict", "collections.Counter",
    *(f"builtins.{t}" for t in ("int", "float", "str", "bytes", "dict", "list", "tuple", "set",
                                "frozenset", "bytearray", "complex", "slice", "range", "object",
                                "type", "bool")),
}
#: Encodings ``_codecs.encode``/``bytearray`` may name for the walk to evaluate the call.
LITERAL_ENCODINGS = {"latin1", "latin-1", "iso-8859-1", "iso8859-1", "utf-8", "utf8", "ascii"}
