"""The house plan holds: no import circle among ckptaudit modules or between its packages, no module over 400
lines but data tables, no module-level mutable state but the listed, and no framework named outside the
producers' modules but the data files listed (``NAMES_A_FRAMEWORK``, each with its reason; both lists only shrink).

Imports are read from the AST of every ``ckptaudit/**/*.py`` (function-level imports count: a circle
through a lazy import is still a circle a reader has to untangle).  A package is its ``__init__``;
``from . import x`` is an edge to the submodule ``x`` when there is one, else to the package.

``DATA_TABLES`` are the modules allowed over the limit because they are data, each with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

PKG = Path(__file__).resolve().parents[1] / "ckptaudit"
MAX_LINES = 400

#: modules allowed over the limit because they are data, with the reason
DATA_TABLES: Dict[str, str] = {}

def _modules() -> Dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_package(mod: str, mods: Dict[str, Path]) -> bool:
    return mods[mod].name == "__init__.py"


def _edges(mods: Dict[str, Path]) -> Dict[str, List[Tuple[str, int, str]]]:
    """{module: [(imported module, line, import text)]} for imports of ckptaudit modules."""
    out: Dict[str, List[Tuple[str, int, str]]] = {m: [] for m in mods}
    for mod, path in mods.items():
        here = mod if _is_package(mod, mods) else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: List[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    targets.append(sub if sub in mods else src)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != mod:
                    out[mod].append((t, node.lineno, ast.unparse(node)))
    return out


def _cycles(edges: Dict[str, List[Tuple[str, int, str]]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on: Set[str] = set()
    stack: List[str] = []
    out: List[List[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted({t for t, _, _ in edges[root]})))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter
                counter += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted({t for t, _, _ in edges[w]}))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def test_no_import_cycle():
    mods = _modules()
    edges = _edges(mods)
    cycles = _cycles(edges)
    lines = []
    for comp in cycles:
        for m in comp:
            for t, line, text in edges[m]:
                if t in comp:
                    lines.append(f"{mods[m].relative_to(PKG.parent)}:{line}: {text}  ({m} -> {t})")
    assert not cycles, "import circles:\n" + "\n".join(lines)


def _package_of(mod: str) -> str:
    """A module's node in the package graph: its sub-package of ``ckptaudit`` (``ckptaudit.formats`` for
    ``ckptaudit.formats.zip.crc``), or itself for a top-level module.  ``ckptaudit/stages/`` is a folder of stages,
    one per rule, layered among themselves as the workflow runs them (the report over the verdict, the verdict over
    the state stage, every stage over the inventory): each stage is a node (``ckptaudit.stages.load`` for
    ``ckptaudit.stages.load.child``), and ``stages/__init__`` (the stage list and the rules' CLI) one more."""
    parts = mod.split(".")
    return ".".join(parts[:3] if len(parts) > 2 and parts[1] == "stages" else parts[:2])


def test_no_import_cycle_between_packages():
    """Sub-packages as nodes: a package imports downward only (``onepass`` reads ``formats``, never back)."""
    edges = _edges(_modules())
    by_pkg: Dict[str, List[Tuple[str, int, str]]] = {}
    for m, es in edges.items():
        by_pkg.setdefault(_package_of(m), [])
        by_pkg[_package_of(m)].extend((_package_of(t), line, f"{m}:{line}: {text}") for t, line, text in es
                                      if _package_of(t) != _package_of(m))
    cycles = _cycles(by_pkg)
    lines = [text for comp in cycles for p in comp for t, _, text in by_pkg[p] if t in comp]
    assert not cycles, "package circles:\n" + "\n".join(sorted(set(lines)))


def test_no_module_over_400_lines_except_data_tables():
    mods = _modules()
    sizes = {m: len(p.read_text().splitlines()) for m, p in mods.items()}
    over = {m for m, n in sizes.items() if n > MAX_LINES}
    unexplained = sorted(over - set(DATA_TABLES))
    assert not unexplained, {m: sizes[m] for m in unexplained}


def test_the_edge_reader_sees_function_level_and_package_imports():
    mods = _modules()
    edges = _edges(mods)
    assert any(t == "ckptaudit.newest_first" for t, _, _ in edges["ckptaudit.safe_load"])  # inside safe_load_checkpoint
    assert "ckptaudit.layouts" in {t for t, _, _ in edges["ckptaudit.discovery"]}  # `from . import fs, layouts`
    assert _cycles({"a": [("b", 1, "")], "b": [("a", 2, "")], "c": [("a", 3, "")]}) == [["a", "b"]]


#: Module-level containers the code mutates, each with what it holds.  Issue 25 asks for no module-level mutable
#: cache; the hash stage's byte facts left this list (a ``ByteFacts`` value each stage loads and hands to its
#: checks).  What remains is process state (I/O counters, locks held, saves in flight) and caches still to turn
#: into values: the list only shrinks, and a new entry fails this test.
MODULE_STATE: Dict[str, str] = {
    "ckptaudit.fs.counters._bytes": "process state: bytes read, per purpose",
    "ckptaudit.fs.counters._gets": "process state: GETs issued, per purpose",
    "ckptaudit.fs.counters._rounds": "process state: round trips, per purpose",
    "ckptaudit.fs.remote._snapshots": "process state: the listing of each remote run this process audits, taken "
                                      "once so every stage sees the run at one moment (refresh() re-lists)",
    "ckptaudit.stages.jobs.helper_server._STARTED": "process state: the servers (load, stage jobs) this process started",
    "ckptaudit.workflow.outlock._HELD": "process state: output-folder locks held",
    "ckptaudit.publish.background._IN_FLIGHT": "process state: background saves not yet committed",
    "ckptaudit.publish.staging._LOCATIONS": "process state: staging buffers reused across saves",
    "ckptaudit.publish.staging._TAGGER_REGISTERED": "process state: whether torch's location tagger is registered",
}


def _module_state(mods: Dict[str, Path]) -> Set[str]:
    """``module.NAME`` of every module-level dict/list/set (literal or ``dict()``/``list()``/``set()``/
    ``defaultdict()``/``OrderedDict()``) that the module mutates (item assignment, a mutating method, or a
    ``global`` statement naming it)."""
    import re

    out = set()
    for mod, path in mods.items():
        src = path.read_text()
        for node in ast.parse(src).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                name, value = node.target.id, node.value
            else:
                continue
            container = isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in ("dict", "list", "set", "defaultdict", "OrderedDict"))
            mutated = re.search(rf"\b{name}\s*(\[[^\]]*\]\s*=(?!=)|\.(append|add|update|setdefault|clear|pop|extend|"
                                rf"insert|remove)\()", src) or re.search(rf"global {name}\b", src)
            if container and mutated:
                out.add(f"{mod}.{name}")
    return out


def test_module_level_state_only_shrinks():
    found = _module_state(_modules())
    assert not found - set(MODULE_STATE), f"new module-level mutable state: {sorted(found - set(MODULE_STATE))}"
    assert not set(MODULE_STATE) - found, f"gone: drop from MODULE_STATE: {sorted(set(MODULE_STATE) - found)}"
    assert not any(k.startswith(("ckptaudit.onepass.facts.", "ckptaudit.fs.kept.")) for k in found)  # values


# ------------------------------------------------------------------ frameworks are named by their producer
#: What names a framework (a string constant that is not a docstring, a name, an attribute): the frameworks
#: the audit knows, and the HF Trainer's own files.  ``trainer_state`` alone is a file role, not a framework.
FRAMEWORK_WORDS = re.compile(r"deepspeed|lightning|megatron|accelerate|transformers|hf-trainer|hf_trainer|"
                             r"trainer_state\.json|nanogpt|torchtitan|\btimm\b|\bpeft\b|ultralytics|\bnemo\b",
                             re.IGNORECASE)
#: A producer's modules: its own in ckptaudit/producers/ and its layout adapter (the scan of its units' files).
PRODUCER_MODULES = re.compile(r"^ckptaudit\.producers(\..*)?$|"
                              r"^ckptaudit\.layouts\.(hf|accelerate|deepspeed|megatron|megatron_dist|dcp|dcp_bytes)$")
#: The integrations: each hooks ckptaudit into one framework's own save/load API, so it imports that framework
#: (``from lightning.fabric… import``) and names it; nothing else outside the producers may.
INTEGRATION_MODULES = re.compile(r"^ckptaudit\.integrations(\..*)?$")
#: The data files outside the producers that name a framework (the acceptance's allowlist), each with its reason.
NAMES_A_FRAMEWORK: Dict[str, str] = {
    "ckptaudit.findings.file": "data: finding texts name the framework the user runs (its repair commands)",
    "ckptaudit.findings.structure": "data: finding texts name the framework the user runs (its converters)",
    "ckptaudit.security.tiers": "data: the tier tables say where a generic class was seen (argparse.Namespace)",
}


def _finding_kinds() -> Set[str]:
    """Finding kinds: identifiers of verdict.json (``megatron_rank_missing``), built by a producer's modules."""
    from ckptaudit import findings

    return set(findings.CATALOGUE)


def _framework_names(path: Path) -> List[Tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
            and isinstance(n.body[0].value.value, str)}
    out = []
    for n in ast.walk(tree):
        text = (n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                else n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute)
                else n.name if isinstance(n, ast.alias) else n.module if isinstance(n, ast.ImportFrom) else None)
        if text and FRAMEWORK_WORDS.search(text) and text not in _finding_kinds():
            out.append((getattr(n, "lineno", 0), text[:60]))
    return out


def test_no_module_outside_a_producer_names_a_framework():
    """A name, a string, an attribute, an imported name or the module of a ``from X import`` (issue 44: an
    ``ImportFrom`` of transformers or lightning went unseen): only a producer's modules, the integrations and the
    listed data files name a framework."""
    found = {m: hits for m, p in _modules().items() if not PRODUCER_MODULES.match(m)
             and not INTEGRATION_MODULES.match(m) and (hits := _framework_names(p))}
    new = {m: hits[:3] for m, hits in found.items() if m not in NAMES_A_FRAMEWORK}
    assert not new, f"ask ckptaudit.producers instead of naming a framework: {new}"
    gone = sorted(set(NAMES_A_FRAMEWORK) - set(found))
    assert not gone, f"no longer names a framework: drop from NAMES_A_FRAMEWORK: {gone}"


# ------------------------------------------------------------------ private names stay private

def _private_imports() -> Tuple[List[str], List[str]]:
    """(across packages, within a package): ``file:line module.name`` of each ``from … import _name``."""
    mods = _modules()
    across, within = [], []
    for mod, path in mods.items():
        here = mod if _is_package(mod, mods) else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("ckptaudit")):
                continue
            base = here.split(".")[: len(here.split(".")) - (node.level - 1)] if node.level else []
            src = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            src_pkg = src if src in mods and _is_package(src, mods) else src.rsplit(".", 1)[0]
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    where = f"{path.relative_to(PKG.parent)}:{node.lineno} {src}.{a.name}"
                    (within if src_pkg == here else across).append(where)
    return across, within


def test_no_private_name_is_imported_from_another_module():
    """A ``_private`` name is used only in the module that defines it: a name two modules share is public,
    with a docstring (issue 25).  Neither across packages nor between siblings of one package."""
    across, within = _private_imports()
    assert not across, "make it public (with a docstring) or keep it in its package:\n" + "\n".join(across)
    assert not within, "make it public (with a docstring) or keep it in its module:\n" + "\n".join(within)



# ------------------------------------------------------------------ one signature: values, not ambient state
#: Module-level functions decorated with ``functools.lru_cache``/``functools.cache`` that may stay: each a pure
#: function of its arguments (or of a constant of the install or the process), with the reason.  What a stage
#: needs beyond that (run folder, config, byte facts, kept bytes, read depth) travels as a parameter.
PURE_CACHES: Dict[str, str] = {
    "ckptaudit.roles._compiled": "regexes compiled from a tuple of (role, pattern) pairs: a function of its argument",
    "ckptaudit.schemas.schema": "a JSON schema shipped inside the package: a constant of the install",
    "ckptaudit.config._parsed_defaults": "config/config.yaml shipped with the package: a constant of the install",
    "ckptaudit.config._schema": "a YAML file's parse keyed by its path and mtime: a function of its arguments",
    "ckptaudit.stages.inventory.parts._read_inventory_once": "inventory.json's parse keyed by path, size and mtime (the rules' "
                                            "input functions, not a stage): a function of its arguments",
    "ckptaudit.stages.configdiff.installed_version": "an installed distribution's version: a constant of the process",
    "ckptaudit.publish.writer._libc_sync_file_range": "a libc symbol looked up once: a constant of the process",
}

#: Impure module caches not yet turned into parameters: this list only shrinks (each entry says what replaces it).
PENDING_CACHES: Dict[str, str] = {}

#: The modules that read or write Parquet: the stages' table I/O, the report, the reader's audit import.
PARQUET_MODULES = {"ckptaudit.tables", "ckptaudit.stages.report", "ckptaudit.newest_first"}

_CACHE_DECORATORS = {"lru_cache", "cache"}


def _decorator_name(d: ast.expr) -> str:
    """``lru_cache`` for ``@lru_cache``, ``@lru_cache(8)``, ``@functools.lru_cache(maxsize=8)`` …"""
    if isinstance(d, ast.Call):
        d = d.func
    if isinstance(d, ast.Attribute):
        return d.attr
    return d.id if isinstance(d, ast.Name) else ""


def _module_caches(mods: Dict[str, Path]) -> Set[str]:
    """``module.function`` of every module-level function (or method of a module-level class) decorated with
    ``lru_cache`` or ``cache``."""
    out = set()
    for mod, path in mods.items():
        for node in ast.parse(path.read_text()).body:
            fns = [node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else [
                f for f in getattr(node, "body", []) if isinstance(node, ast.ClassDef)
                and isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for fn in fns:
                if any(_decorator_name(d) in _CACHE_DECORATORS for d in fn.decorator_list):
                    owner = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
                    out.add(f"{mod}.{owner}{fn.name}")
    return out


def _context_vars(mods: Dict[str, Path]) -> List[str]:
    """``module:line`` of every ``ContextVar(...)`` construction and every ``import contextvars``."""
    out = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            call = isinstance(node, ast.Call) and _decorator_name(node.func) == "ContextVar"
            imp = (isinstance(node, ast.Import) and any(a.name == "contextvars" for a in node.names)) or (
                isinstance(node, ast.ImportFrom) and node.module == "contextvars")
            if call or imp:
                out.append(f"{mod}:{node.lineno}")
    return out


def _parquet_calls(mods: Dict[str, Path]) -> List[str]:
    """``module:line: code`` of every Parquet import (``pyarrow.parquet``, ``pyarrow.dataset``) and every
    ``read_parquet``/``to_parquet`` call outside :data:`PARQUET_MODULES`."""
    out = []
    for mod, path in mods.items():
        if mod in PARQUET_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: List[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            hit = any(n in ("pyarrow.parquet", "pyarrow.dataset") or n.startswith(("pyarrow.parquet.",
                                                                                   "pyarrow.dataset."))
                      for n in names)
            hit = hit or (isinstance(node, ast.Call) and _decorator_name(node.func) in ("read_parquet", "to_parquet"))
            if hit:
                out.append(f"{mod}:{node.lineno}: {ast.unparse(node)[:80]}")
    return out


def test_no_context_var():
    """No ``ContextVar`` (nor ``import contextvars``) anywhere in ckptaudit/: the read depth, a pass's stop and the
    kept bytes travel as parameters (``kept=`` of the remote reads, :mod:`ckptaudit.fs.kept`)."""
    assert _context_vars(_modules()) == [], "a ContextVar (pass a parameter instead)"


def test_module_caches_are_pure_or_listed():
    found = _module_caches(_modules())
    listed = set(PURE_CACHES) | set(PENDING_CACHES)
    assert not set(PURE_CACHES) & set(PENDING_CACHES)
    assert not found - listed, f"a module-level cache (pass the value as a parameter): {sorted(found - listed)}"
    assert not listed - found, f"gone: drop from the lists: {sorted(listed - found)}"


def test_parquet_only_in_the_table_io_the_report_and_the_audit_import():
    assert _parquet_calls(_modules()) == []


def test_the_checkers_see_what_they_look_for(tmp_path):
    """Each checker finds its construct in a module written for it (a checker that sees nothing passes too)."""
    (tmp_path / "m.py").write_text(
        "import contextvars\nimport functools\nimport pyarrow.parquet as pq\nfrom functools import lru_cache\n"
        "V = contextvars.ContextVar('v')\n@functools.lru_cache(maxsize=8)\ndef a(x):\n    return x\n"
        "@lru_cache\ndef b(x):\n    return x\nclass C:\n    @functools.cache\n    def c(self):\n        return 1\n"
        "def d(df):\n    df.to_parquet('x')\n    pq.write_table(None, 'y')\n")
    mods = {"ckptaudit.m": tmp_path / "m.py"}
    assert _module_caches(mods) == {"ckptaudit.m.a", "ckptaudit.m.b", "ckptaudit.m.C.c"}
    assert _context_vars(mods) == ["ckptaudit.m:1", "ckptaudit.m:5"]
    assert [s.split(":")[1] for s in _parquet_calls(mods)] == ["3", "17"]  # the import, and to_parquet


# ------------------------------------------------------------------ the stages: one list, one module per rule
#: Rules of rules/*.smk that are no stage of the audit, each with what it does instead.
NOT_A_STAGE: Dict[str, str] = {
    "stage_config": "plumbing: writes the stage config every stage reads (ckptaudit.workflow.support)",
    "load_server_done": "plumbing: stops the audit's load server after the last load job",
    "demo": "writes the bundled demo run (ckptaudit.demo), not an audit stage",
    "drill": "the restore drill after the audit (ckptaudit.drill)",
    "drill_dated": "the restore drill's dated summary (ckptaudit.drill)",
    "drill_nightly": "the restore drill's nightly target: files only",
}


def _rules() -> Dict[str, str]:
    """{rule: its text} of every ``rule``/``checkpoint`` in rules/*.smk."""
    out = {}
    for p in sorted((PKG.parent / "rules").glob("*.smk")):
        text = p.read_text()
        heads = list(re.finditer(r"^(?:rule|checkpoint)\s+(\w+)\s*:", text, re.M))
        for h, nxt in zip(heads, heads[1:] + [None]):
            out[h.group(1)] = text[h.start(): nxt.start() if nxt else len(text)]
    return out


def test_every_stage_rule_has_its_module_and_its_shell_line_names_it():
    """Issue 44: a rule leads to a module of its name (``rule hash`` -> ``ckptaudit/stages/hash.py``, run as
    ``python -m ckptaudit.stages hash``), and the stage rules are exactly ``ckptaudit.stages.STAGES``."""
    from ckptaudit.stages import STAGES

    rules = _rules()
    stage_rules = [r for r in rules if r not in NOT_A_STAGE]
    assert sorted(stage_rules) == sorted(STAGES)
    for rule in stage_rules:
        here = PKG / "stages"
        assert (here / f"{rule}.py").is_file() or (here / rule / "__init__.py").is_file(), f"no stages/{rule}"
        assert re.search(rf"-m ckptaudit\.stages {rule}\b", rules[rule]), f"rule {rule}: shell line must name it"
    assert not set(NOT_A_STAGE) - set(rules), f"drop from NOT_A_STAGE: {sorted(set(NOT_A_STAGE) - set(rules))}"


def test_the_stage_list_is_defined_once():
    """Every place that lists the stages or their tables holds ``ckptaudit.stages.STAGES`` / ``TABLES``, in
    their order: the findings' stages, the layer each stage checks, the verdict's and the reader's tables, the
    report's arguments (the pipeline derives its own from ``TABLES``)."""
    from ckptaudit import newest_first, verdict
    from ckptaudit.findings import build, model
    from ckptaudit.stages import STAGES, TABLES, report

    part = tuple(TABLES)
    assert part == tuple(s for s in STAGES if s in TABLES)
    assert model.STAGES == (*STAGES, "any")
    assert tuple(build.STAGE_LAYER) == part
    assert verdict._STAGES == part
    assert newest_first.TABLES == part
    assert report.STAGES == tuple(t for s in part for t in TABLES[s])


def test_every_per_part_stage_has_the_one_run_signature():
    """Issue 44: each per-part stage (``ckptaudit.stages.TABLES``) is a module of the stage's name with one entry
    point, ``run(ctx: StageContext, part: Part, rows: EarlierRows, *, …) -> <its rows>``: the same three
    positional parameters in every stage, anything else keyword-only with a default, and typed rows out (a
    frozen dataclass of :mod:`ckptaudit.stages.rows`)."""
    import dataclasses
    import importlib
    import inspect

    from ckptaudit.stages import TABLES, rows

    for stage in TABLES:
        run = importlib.import_module(f"ckptaudit.stages.{stage}").run
        sig = inspect.signature(run)
        params = list(sig.parameters.values())
        head = [(p.name, p.annotation, p.kind) for p in params[:3]]
        assert head == [(n, a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n, a in
                        (("ctx", "StageContext"), ("part", "Part"), ("rows", "EarlierRows"))], f"{stage}.run: {sig}"
        rest = params[3:]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not p.empty for p in rest), \
            f"{stage}.run: every further parameter keyword-only with a default: {sig}"
        out = getattr(rows, sig.return_annotation, None)
        assert out is not None and dataclasses.is_dataclass(out) and out.__dataclass_params__.frozen, \
            f"{stage}.run returns {sig.return_annotation!r}: a frozen dataclass of ckptaudit.stages.rows"


def test_every_stage_rows_holds_typed_rows():
    """Issue 44: rows are typed.  Every ``*Rows`` of :mod:`ckptaudit.stages.rows` holds its rows as a tuple of a
    frozen dataclass (or ``pyarrow`` tables, a table of columns), never ``dict``; and each row class
    (a ``TableRow``) has one field per column of its table, named as in ``tables.SCHEMAS``, in order, with
    ``findings_json`` held as ``findings``."""
    import dataclasses

    from ckptaudit import tables
    from ckptaudit.stages import rows

    holders = [c for n, c in vars(rows).items() if n.endswith("Rows") and dataclasses.is_dataclass(c)]
    assert {c.__name__ for c in holders} >= {"HashRows", "ScanRows", "LoadRows", "StructureRows", "ConfigdiffRows",
                                             "StateRows"}
    for c in holders:
        for f in dataclasses.fields(c):
            m = re.fullmatch(r"Tuple\[(.+), \.\.\.\]", str(f.type))
            if m is None:
                continue
            elem = m.group(1).strip("'\"")
            assert elem not in ("dict", "Dict", "Mapping", "Any") and not elem.startswith(("dict[", "Dict[")), \
                f"{c.__name__}.{f.name}: {f.type}"
            if elem == "pa.Table":
                continue
            row = getattr(rows, elem, None)
            assert row is not None and dataclasses.is_dataclass(row) and row.__dataclass_params__.frozen, \
                f"{c.__name__}.{f.name}: {f.type} is no frozen dataclass of ckptaudit.stages.rows"
    row_classes = [c for c in vars(rows).values() if isinstance(c, type) and issubclass(c, rows.TableRow)
                   and c is not rows.TableRow]
    assert {c.TABLE for c in row_classes} >= {"hash", "load", "structure", "configdiff", "state", "imports"}
    for c in row_classes:
        assert c.__dataclass_params__.frozen
        want = ["findings" if n == "findings_json" else n for n in tables.SCHEMAS[c.TABLE].names]
        assert [f.name for f in dataclasses.fields(c)] == want, c.__name__


def test_the_in_process_audit_reads_no_parquet(tmp_path, monkeypatch):
    """Issue 44: ``audit_in_process`` hands each stage's rows to the next in memory and writes the tables once
    for the report: it reads no Parquet file back (every pyarrow Parquet reader raises here), and writes the
    report's tables all the same."""
    import pyarrow.parquet as pq

    from ckptaudit.pipeline import audit_in_process

    from .conftest import CASES

    def refuse(*a, **k):
        raise AssertionError(f"audit_in_process read Parquet: {a[:1]}")

    monkeypatch.setattr(pq, "ParquetFile", refuse)
    monkeypatch.setattr(pq, "read_table", refuse)
    v = audit_in_process(CASES / "zero_tail_zip", {"load": {"enabled": True}}, tmp_path / "out")
    assert v["recommendation"] == "retrain" and v["units"][0]["usable_for"] == "none"
    written = sorted(p.name for p in (tmp_path / "out" / "tables").glob("*.parquet"))
    assert written == sorted(f"{t}.parquet" for t in ("inventory", "hash", "scan", "tensors", "imports", "load",
                                                      "structure", "configdiff", "state", "units", "pointers"))
    monkeypatch.undo()
    kinds = pq.read_table(tmp_path / "out" / "tables" / "units.parquet", columns=["kinds"]).to_pylist()
    assert ["zero_filled_tail" in str(r["kinds"]) for r in kinds] == [True], kinds


# ------------------------------------------------------------------ the size of each room
MAX_ROOT_MODULES = 25
MAX_FOLDER_ENTRIES = 20


def test_the_root_holds_at_most_25_modules_and_no_folder_more_than_20():
    """Issue 44: the root had grown to 71 flat modules.  The root keeps the public faces (at most 25 modules);
    every other folder holds at most 20 entries (modules and sub-folders)."""
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules in ckptaudit/: {root}"
    big = {}
    for d in sorted(p for p in PKG.rglob("*") if p.is_dir() and p != PKG and p.name != "__pycache__"):
        entries = [e for e in d.iterdir() if e.name != "__pycache__" and not e.name.startswith(".")]
        if len(entries) > MAX_FOLDER_ENTRIES:
            big[str(d.relative_to(PKG.parent))] = len(entries)
    assert not big, f"folders over {MAX_FOLDER_ENTRIES} entries: {big}"


def test_the_framework_check_sees_import_from_modules(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from transformers.trainer import Trainer\nfrom lightning.fabric import io as fio\n")
    assert [t for _, t in _framework_names(p)] == ["transformers.trainer", "lightning.fabric"]
    assert INTEGRATION_MODULES.match("ckptaudit.integrations.hf") and not INTEGRATION_MODULES.match("ckptaudit.stages")
