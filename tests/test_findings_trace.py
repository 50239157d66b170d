"""A finding is traceable: each kind names its stage and detector, is built only there, and docs/findings.md lists it.

Every ``make("kind", ...)`` call in ``ckptaudit/`` (``make``, ``F.make``, ``findings.make``, found by AST)
must pass a literal kind and sit in the module of that kind's declared detector, and the detector itself
must contain one of the calls.  There are no exceptions: a kind two modules decide gets one builder in
its detector's module, which the other calls (e.g. ``formats.zeros``, ``layouts.leftovers``).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

from ckptaudit import findings as F

from .conftest import REPO

PKG = REPO / "ckptaudit"
STAGES = {"inventory", "hash", "scan", "load", "configdiff", "target", "structure", "state", "report", "any"}


class Site(NamedTuple):
    module: str
    qualname: str  # enclosing classes and functions, "" at module level
    line: int
    kind: Optional[str]  # None when the kind is not a literal


def _module_name(p: Path) -> str:
    parts = list(p.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _make_names(tree: ast.AST, mod: str, is_pkg: bool):
    """(names bound to the findings package, names bound to its make) in one module."""
    pkgs, makes = {"F", "findings"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = _resolve(mod, is_pkg, node)
            for a in node.names:
                if src == "ckptaudit" and a.name == "findings":
                    pkgs.add(a.asname or a.name)
                elif src.startswith("ckptaudit.findings") and a.name == "make":
                    makes.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "ckptaudit.findings" and a.asname:
                    pkgs.add(a.asname)
    return pkgs, makes


def make_sites() -> List[Site]:
    out: List[Site] = []
    for p in sorted(PKG.rglob("*.py")):
        if "findings" == p.relative_to(PKG).parts[0]:
            continue  # the catalogue itself
        mod = _module_name(p)
        tree = ast.parse(p.read_text(), str(p))
        pkgs, makes = _make_names(tree, mod, p.name == "__init__.py")

        def visit(node: ast.AST, scope: List[str]) -> None:
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(ch, scope + [ch.name])
                    continue
                if isinstance(ch, ast.Call):
                    fn = ch.func
                    if ((isinstance(fn, ast.Name) and fn.id in makes)
                            or (isinstance(fn, ast.Attribute) and fn.attr == "make"
                                and isinstance(fn.value, ast.Name) and fn.value.id in pkgs)):
                        a = ch.args[0] if ch.args else None
                        kind = a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None
                        out.append(Site(mod, ".".join(scope), ch.lineno, kind))
                visit(ch, scope)

        visit(tree, [])
    return out


def _where(s: Site) -> str:
    return f"{s.module.replace('.', '/')}.py:{s.line} ({s.qualname or '<module>'})"


def _inside(s: Site, qual: str) -> bool:
    return s.qualname == qual or s.qualname.startswith(qual + ".")


# ------------------------------------------------------------------------------------------- (1)
def test_every_kind_has_a_stage_and_a_detector_that_resolves():
    assert set(F.STAGES) == STAGES
    bad = []
    for k in F.CATALOGUE.values():
        if k.stage not in STAGES:
            bad.append(f"{k.kind}: stage {k.stage!r} is not one of {sorted(STAGES)}")
        mod, sep, qual = k.detector.partition(":")
        if not (sep and mod.startswith("ckptaudit.") and qual):
            bad.append(f"{k.kind}: detector {k.detector!r} is not module:function")
            continue
        try:
            obj = importlib.import_module(mod)
            for part in qual.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            bad.append(f"{k.kind}: detector {k.detector} does not resolve ({e})")
            continue
        if not callable(obj) or getattr(obj, "__module__", mod) != mod:
            bad.append(f"{k.kind}: {k.detector} is not a function defined in {mod} (a re-export?)")
    assert not bad, "\n".join(bad)


def test_make_copies_stage_and_detector_into_the_finding():
    f = F.make("zip_crc_mismatch", path="ckpt.pt", member="archive/data/0", expected="1", actual="2")
    k = F.CATALOGUE["zip_crc_mismatch"]
    assert (f.stage, f.detector) == (k.stage, k.detector) == ("scan", k.detector) and k.detector
    d = f.to_dict()
    assert d["stage"] == k.stage and d["detector"] == k.detector
    assert F.Finding.from_dict(d) == f
    old = {key: v for key, v in d.items() if key not in ("stage", "detector")}  # a table written before
    assert F.Finding.from_dict(old).detector == ""
    assert F.make("audit_error", path="u", stage="hash", error_type="E", error="e").stage == "hash"


# ------------------------------------------------------------------------------------------- (2)
def test_every_make_call_uses_a_literal_kind():
    sites = make_sites()
    assert len(sites) > 100, "the AST walk found too few make() calls"
    unlisted = sorted(_where(s) for s in sites if s.kind is None)
    assert not unlisted, "make() with a non-literal kind (pass the kind as a string literal):\n" + "\n".join(unlisted)
    unknown = sorted(f"{_where(s)}: {s.kind}" for s in sites if s.kind is not None and s.kind not in F.CATALOGUE)
    assert not unknown, unknown


def test_each_kind_is_made_only_in_its_detector_module():
    sites = make_sites()
    by_kind: Dict[str, List[Site]] = {}
    for s in sites:
        if s.kind is not None:
            by_kind.setdefault(s.kind, []).append(s)
    bad = []
    for k in F.CATALOGUE.values():
        mod, _, qual = k.detector.partition(":")
        here = by_kind.get(k.kind, [])
        unexpected = [_where(s) for s in here if s.module != mod]
        if unexpected:
            bad.append(f"{k.kind} (detector {k.detector}) is also made in {', '.join(unexpected)}")
        in_detector = [s for s in here if s.module == mod and _inside(s, qual)]
        if not in_detector:
            where = ", ".join(_where(s) for s in here) or "nowhere"
            bad.append(f"{k.kind}: its detector {k.detector} does not make it (made at {where})")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------------------- (3)
def test_docs_findings_md_is_generated():
    text = (REPO / "docs" / "findings.md").read_text()
    assert text == F.findings_markdown(), "run `ckptaudit findings --update-readme`"
    for k in F.CATALOGUE.values():
        assert f"| `{k.kind}` | {k.layer} | {k.stage} | `{k.detector}` |" in text, k.kind


def test_update_readme_also_writes_docs_findings_md(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- findings:start -->\nold\n<!-- findings:end -->\nend\n")
    assert F.update_readme(readme) is True
    assert F.catalogue_markdown() in readme.read_text()
    assert (tmp_path / "docs" / "findings.md").read_text() == F.findings_markdown()
    assert F.update_readme(readme) is False
