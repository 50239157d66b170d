"""What ``torch.jit.load`` does with the imports of a TorchScript archive's pickles, and the finding that follows.

A TorchScript archive (``torch.jit.save``) is a zip like a ``torch.save`` one, with ``<prefix>/data.pkl`` (the
module's attributes), ``<prefix>/constants.pkl`` (the tensors and values its code refers to as constants),
``<prefix>/code/**.py`` (TorchScript source), ``<prefix>/code/**.py.debug_pkl`` (source ranges) and
``<prefix>/version``.  Facts used, and where they come from (torch 2.13):

* ``torch.load`` calls an archive TorchScript when it holds a record ``constants.pkl`` under its folder
  (torch/serialization.py ``_is_torchscript_zip``); it then refuses it under ``weights_only=True`` ("Cannot use
  ``weights_only=True`` with TorchScript archives") and hands it to ``torch.jit.load`` otherwise, so Python's
  unpickler never reads its data.pkl.
* ``torch.jit.load`` reads data.pkl, constants.pkl and (lazily, for error messages) the ``.debug_pkl``
  records with the C++ unpickler (torch/csrc/jit/serialization/unpickler.cpp ``Unpickler::readGlobal``,
  driven by torch/csrc/jit/serialization/import.cpp and import_read.cpp).  It imports no Python global: it
  knows the fixed names of :data:`CPP_GLOBALS`, ``torch.<Scalar>Storage`` and the quantization schemes
  ``torch.per_tensor_affine``…; any other ``module.name`` goes to the archive's type resolver, which only
  compiles TorchScript classes from the archive's own ``code/<module as a path>.py``
  (torch/csrc/jit/serialization/import_source.cpp ``SourceImporterImpl::findNamedType``), and fails the load
  ("Unknown type name 'os.system'") when there is none.  Checked against the installed torch by
  ``tests/test_archive_pickles.py``: an archive whose constants.pkl or data.pkl is a ``GLOBAL os system`` +
  ``REDUCE`` raises ``RuntimeError`` in ``torch.jit.load`` and runs nothing.

So a name in a TorchScript pickle is never code execution by unpickling through torch: it either is one of
those types, or the load fails.  It still is a pickle: a tool that opens the record with Python's ``pickle``
imports and calls what it names, and the finding says so.  Dangerous names keep their tier's reason
(:mod:`ckptaudit.security.dangers`) in the finding's detail.  This module imports neither torch nor pickle.
"""

from __future__ import annotations

from typing import Collection, FrozenSet, List, Sequence, Tuple

from .. import findings, security
from ..findings import Finding
from ..formats.zip.reader import strip_prefix
from ..pickle_walk import WalkResult
from ..pickle_walk.dtypes import dtype_of_storage_type

__all__ = ["CPP_GLOBALS", "QSCHEMES", "code_modules", "cpp_resolves", "is_torchscript", "read_by_jit", "scan"]

#: The ``module.name`` globals ``Unpickler::readGlobal`` (torch/csrc/jit/serialization/unpickler.cpp) handles
#: itself, besides ``torch.<Scalar>Storage`` and :data:`QSCHEMES`.
CPP_GLOBALS: FrozenSet[str] = frozenset({
    "__main__.TensorID", "__main__.IntList",  # bc-compatibility of old archives
    "torch.jit._pickle.build_tensor_from_id", "torch.jit._pickle.restore_type_tag",
    "torch.jit._pickle.build_intlist", "torch.jit._pickle.build_tensorlist",
    "torch.jit._pickle.build_doublelist", "torch.jit._pickle.build_boollist",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_qtensor", "torch._utils._rebuild_sparse_tensor",
    "torch._tensor._rebuild_from_type_v2", "builtins.complex", "collections.OrderedDict", "torch.device",
    "torch.distributed.rpc.rref",
})
#: ``torch.<name>`` quantization schemes the C++ unpickler resolves (c10/core/QScheme.h ``toString``).
QSCHEMES: FrozenSet[str] = frozenset({"per_tensor_affine", "per_channel_affine", "per_tensor_symmetric",
                                      "per_channel_symmetric", "per_channel_affine_float_qparams"})
_SOURCE = ("read by torch.jit.load's C++ unpickler (torch/csrc/jit/serialization/unpickler.cpp), which "
           "imports no Python global")


def is_torchscript(names: Collection[str], prefix: str) -> bool:
    """Whether a zip whose record names are ``names`` (archive folder ``prefix``) is what ``torch.load`` takes
    for a TorchScript archive: it holds ``<prefix>/constants.pkl`` (torch/serialization.py
    ``_is_torchscript_zip``, on the record names without their folder)."""
    return (f"{prefix}/constants.pkl" if prefix else "constants.pkl") in names


def read_by_jit(member: str, prefix: str) -> bool:
    """Whether ``torch.jit.load`` unpickles record ``member`` (its C++ unpickler): ``data.pkl``,
    ``constants.pkl`` and the ``code/**.debug_pkl`` source ranges; ``extra/`` files come back as bytes."""
    rest = strip_prefix(member, prefix)
    return rest in ("data.pkl", "constants.pkl") or (rest.startswith("code/") and rest.endswith(".debug_pkl"))


def code_modules(names: Collection[str], prefix: str) -> FrozenSet[str]:
    """The qualified module names whose TorchScript source the archive holds: ``<prefix>/code/a/b.py`` gives
    ``"a.b"`` (the file the type resolver compiles for a name ``a.b.Class``)."""
    head = f"{prefix}/code/" if prefix else "code/"
    return frozenset(n[len(head):-3].replace("/", ".") for n in names if n.startswith(head) and n.endswith(".py"))


def cpp_resolves(module: str, name: str, code: Collection[str]) -> bool:
    """Whether the C++ unpickler resolves ``GLOBAL module name`` without failing the load: a name it handles
    itself, or a TorchScript class of the archive's own code (``module`` in ``code``, :func:`code_modules`)."""
    full = f"{module}.{name}"
    if full in CPP_GLOBALS:
        return True
    if module == "torch":
        if name in QSCHEMES:
            return True
        if name.endswith("Storage"):
            try:
                dtype_of_storage_type(name)
                return True
            except KeyError:
                return False
        return False
    return module in code


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in sorted(set(names)))


def scan(result: WalkResult, *, path: str, member: str, code: Collection[str]
         ) -> Tuple[List[security.ImportVerdict], List[Finding]]:
    """Judge the imports of one TorchScript pickle (``result``, every stream of record ``member``) the way
    ``torch.jit.load`` reads it.  Returns one verdict per distinct import (category ``torchscript`` for a name
    the C++ unpickler resolves, ``torchscript_refused`` otherwise, with the Python tier's reason when the name
    is dangerous) and ``[torchscript_pickle_global]`` when any is refused, else ``[]``.  The walk's tricks
    (computed names, hidden streams…) are kept in that finding's detail, not made ``pickle_obfuscation``: a
    computed name is refused like any unknown one, and the C++ unpickler reads one stream and runs no Python."""
    verdicts: List[security.ImportVerdict] = []
    for g in result.distinct_globals():
        if g.literal and cpp_resolves(g.module, g.name, code):
            verdicts.append(security.ImportVerdict(g.module, g.name, "torchscript", _SOURCE))
            continue
        py = security.classify_import(g.module, g.name) if g.literal else None
        why = f"; under Python's pickle: {py.category} ({py.source})" if py is not None else ""
        verdicts.append(security.ImportVerdict(g.module, g.name, "torchscript_refused",
                                               f"not a type the C++ unpickler knows nor a TorchScript class of "
                                               f"the archive's code/{why}"))
    refused = [v for v in verdicts if v.category == "torchscript_refused"]
    if not refused:
        return verdicts, []
    dangerous = sorted({v.qualname for v in refused if "under Python's pickle: dangerous" in v.source})
    py_note = f" ({_quoted(dangerous)} would run code there)" if dangerous else ""
    return verdicts, [findings.make("torchscript_pickle_global", path=path, member=member,
                                    names=_quoted([v.qualname for v in refused]), py_note=py_note,
                                    imports=sorted({v.qualname for v in refused}), dangerous=dangerous,
                                    tricks=result.all_tricks())]
