"""An audit's (and a drill's) result as JUnit XML, for the test-report views of CI systems (``--junit PATH``).

A nightly restore drill run from Jenkins, GitLab CI or GitHub Actions is read where those systems already
show test results.  The document (:func:`document`) is::

    <testsuites name="ckptaudit" tests failures errors time>
      <testsuite name="audit" …>            one per audit
        <properties> run_dir, recommendation, rollback unit and step, steps at risk </properties>
        <testcase classname="ckptaudit.audit" name="verdict">   fails unless the newest unit resumes (exit 0)
        <testcase classname="ckptaudit.audit.unit" name="UNIT">  one per unit, in save order
        <testcase classname="ckptaudit.audit.run" name="KIND">   one per run-level finding (leftovers, pointers)
      </testsuite>
      <testsuite name="drill" …>            when a drill ran: one test case per check and device
    </testsuites>

A unit's test case **fails** when the unit is not usable for resume or holds an error; its failure text is
every such finding: layer, severity, kind, what it is, the next step and the repair as printed in the summary.
A unit that is only a save in progress is **skipped** (it is nobody's rollback point yet); warnings go to the
case's ``system-out``.  A drill check's ``fail`` is a failure (an ``error`` when it is a check that means the
drill could not run, :data:`ckptaudit.drill.INFRA_CHECKS`), ``skip`` is skipped, ``warn`` passes with the
warning in ``system-out``.

Format facts from the JUnit dialect the Jenkins xUnit plugin's ``junit-10.xsd`` describes (and pytest's
``--junitxml`` writes): ``testsuite`` requires ``name``, ``tests``, ``failures``, ``errors``; ``testcase``
requires ``name``; ``failure``/``error``/``skipped`` carry ``message`` and ``type`` attributes and text;
``time`` is seconds with a decimal point.  XML 1.0 cannot hold most C0 control characters, so every text
from the run goes through :func:`ckptaudit.terminal_text.shown` (a CI log shows this text too).
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import xml.etree.ElementTree as ET
from typing import Iterable, List, Mapping, Optional, Sequence

from ..terminal_text import shown

IN_PROGRESS = "unit_in_progress"


def _text(s: object) -> str:
    """One or more lines of ``s``, each shown (controls escaped), line breaks kept."""
    return "\n".join(shown(ln) for ln in str(s).split("\n"))


def _finding_text(f: Mapping, run_dir: str) -> str:
    from .summary import repair_where

    lines = [f"[{f.get('layer')}/{f.get('severity')}] {f.get('kind')}: {' '.join(str(f.get('message', '')).split())}"]
    if f.get("next_step"):
        lines.append(f"  next step: {' '.join(str(f['next_step']).split())}")
    if f.get("repair"):
        lines.append(f"  repair ({repair_where(str(f['repair']), run_dir)}): {f['repair']}")
    if f.get("path"):
        lines.append(f"  file: {f['path']}")
    return "\n".join(lines)


def _case(suite: ET.Element, classname: str, name: str, seconds: float = 0.0) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=shown(name), time=f"{max(0.0, seconds):.3f}")


def _outcome(case: ET.Element, tag: str, message: str, kind: str, text: str = "") -> None:
    el = ET.SubElement(case, tag, message=shown(" ".join(message.split())), type=shown(kind))
    if text:
        el.text = _text(text)


def _out(case: ET.Element, lines: Sequence[str]) -> None:
    if lines:
        ET.SubElement(case, "system-out").text = _text("\n".join(lines))


def _caps_below_resume(f: Mapping) -> bool:
    return f.get("caps") in ("warm-start", "none")


def _unit_case(suite: ET.Element, u: Mapping, run_dir: str) -> None:
    step = "step unknown" if u.get("step") is None else f"step {u['step']}"
    case = _case(suite, "ckptaudit.audit.unit", f"{u['unit']} ({step})")
    findings = list(u.get("findings") or [])
    bad = [f for f in findings if _caps_below_resume(f) or f.get("severity") == "error"]
    if u.get("usable_for") != "resume" and bad and all(f.get("kind") == IN_PROGRESS for f in bad):
        _outcome(case, "skipped", f"a save in progress: {bad[0].get('message', '')}", IN_PROGRESS)
    elif u.get("usable_for") != "resume" or bad:
        first = next((f for f in bad if _caps_below_resume(f)), bad[0] if bad else {"message": "not usable"})
        use = u.get("usable_for")
        head = "usable for warm-start only" if use == "warm-start" else (
            "not usable" if use == "none" else "usable for resume, with errors")
        _outcome(case, "failure", f"{head}: {first.get('message', '')}", str(first.get("kind", use)),
                 "\n".join(_finding_text(f, run_dir) for f in bad) + f"\n(paths are relative to {run_dir})")
    _out(case, [_finding_text(f, run_dir) for f in findings if f not in bad and f.get("severity") == "warning"])


def _verdict_case(suite: ET.Element, v: Mapping, seconds: float) -> None:
    from ..verdict import exit_code

    case = _case(suite, "ckptaudit.audit", "verdict", seconds)
    code = exit_code(dict(v))
    reasons = [str(r) for r in v.get("reasons") or []]
    if code != 0:
        rec = str(v.get("recommendation")).upper()
        rb = v.get("rollback") or {}
        where = f" from {rb.get('unit')} (step {rb.get('step')})" if rb else ""
        _outcome(case, "failure", f"{rec}{where}: {reasons[0] if reasons else ''}", f"exit {code}",
                 "\n".join(reasons))
    else:
        _out(case, reasons)


def _run_cases(suite: ET.Element, v: Mapping) -> None:
    run_dir = str(v.get("run_dir") or "the run folder")
    for f in list(v.get("run_findings") or []) + list(v.get("pointer_findings") or []):
        if not f:
            continue
        case = _case(suite, "ckptaudit.audit.run", f"{f.get('kind')} {f.get('path') or ''}".strip())
        if f.get("severity") == "error":
            _outcome(case, "failure", str(f.get("message", "")), str(f.get("kind")), _finding_text(f, run_dir))
        else:
            _out(case, [_finding_text(f, run_dir)])


def _props(suite: ET.Element, pairs: Iterable[tuple]) -> None:
    props = ET.SubElement(suite, "properties")
    for k, val in pairs:
        if val is not None:
            ET.SubElement(props, "property", name=k, value=shown(val))


def _suite(root: ET.Element, name: str, started: Optional[str]) -> ET.Element:
    return ET.SubElement(root, "testsuite", name=name, tests="0", failures="0", errors="0", skipped="0",
                         timestamp=started or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
                         hostname=socket.gethostname())


def audit_suite(root: ET.Element, v: Mapping, seconds: float = 0.0, started: Optional[str] = None) -> ET.Element:
    """Add the audit's ``testsuite`` for verdict ``v`` (a parsed ``verdict.json``) to ``root``; ``seconds`` is
    the audit's wall time."""
    suite = _suite(root, "audit", started)
    rb = v.get("rollback") or {}
    _props(suite, [("run_dir", v.get("run_dir")), ("recommendation", v.get("recommendation")),
                   ("rollback_unit", rb.get("unit")), ("rollback_step", rb.get("step")),
                   ("steps_at_risk", v.get("steps_lost"))])
    _verdict_case(suite, v, seconds)
    for u in v.get("units") or []:
        _unit_case(suite, u, str(v.get("run_dir") or "the run folder"))
    _run_cases(suite, v)
    _count(suite, seconds)
    return suite


def drill_suite(root: ET.Element, doc: Mapping, started: Optional[str] = None,
                infra_checks: Sequence[str] = ()) -> ET.Element:
    """Add the drill's ``testsuite`` for ``doc`` (a parsed ``drill.json``, with its ``rows``) to ``root``; a failed
    check named in ``infra_checks`` (the drill's, :data:`ckptaudit.drill.INFRA_CHECKS`) is an error, not a
    failure.  The drill hands them in: the outputs sit below the drill and do not import it."""
    suite = _suite(root, "drill", started or doc.get("started_utc"))
    _props(suite, [("run_dir", doc.get("run_dir")), ("unit", doc.get("unit")), ("step", doc.get("step")),
                   ("result", doc.get("result"))])
    for r in doc.get("rows") or []:
        dev = r.get("device") or "run"
        case = _case(suite, f"ckptaudit.drill.{shown(dev)}", str(r.get("check")), float(r.get("check_seconds") or 0))
        detail = f"expected: {r.get('expected', '')}\nactual: {r.get('actual', '')}\n{r.get('message', '')}"
        if r.get("status") == "fail":
            tag = "error" if r.get("check") in infra_checks else "failure"
            _outcome(case, tag, str(r.get("message", "")), str(r.get("check")), detail)
        elif r.get("status") == "skip":
            _outcome(case, "skipped", str(r.get("message", "")), "skip")
        elif r.get("status") == "warn":
            _out(case, [f"warning: {r.get('message', '')}"])
    _count(suite, float(doc.get("wall_seconds") or 0.0))
    return suite


def _count(suite: ET.Element, seconds: float) -> None:
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        suite.set(attr, str(sum(c.find(tag) is not None for c in cases)))
    suite.set("time", f"{max(0.0, seconds):.3f}")


def document(verdict: Optional[Mapping], *, audit_seconds: float = 0.0, drill: Optional[Mapping] = None,
             error: str = "", infra_checks: Sequence[str] = ()) -> ET.ElementTree:
    """The ``testsuites`` tree of one audit (``verdict`` None when the audit failed: then one ``error`` test
    case whose text is ``error``) and optionally its drill (``infra_checks``: see :func:`drill_suite`)."""
    root = ET.Element("testsuites", name="ckptaudit")
    if verdict is not None:
        audit_suite(root, verdict, audit_seconds)
    else:
        suite = _suite(root, "audit", None)
        _outcome(_case(suite, "ckptaudit.audit", "verdict", audit_seconds), "error",
                 error or "the audit itself failed", "exit 3", error)
        _count(suite, audit_seconds)
    if drill is not None:
        drill_suite(root, drill, infra_checks=infra_checks)
    suites = root.findall("testsuite")
    for attr in ("tests", "failures", "errors"):  # junit-10.xsd: testsuites has no skipped count
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    root.set("time", f"{sum(float(s.get('time', '0')) for s in suites):.3f}")
    return ET.ElementTree(root)


def write(path: str | os.PathLike, verdict: Optional[Mapping], **kw) -> None:
    """Write :func:`document` to ``path`` atomically (temp file, fsync, rename), creating its folder when
    missing.  Raises ``OSError``."""
    from pathlib import Path

    from .._io import atomic_write

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tree = document(verdict, **kw)
    ET.indent(tree)
    atomic_write(path, ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True) + b"\n")


def failures(path: str | os.PathLike) -> List[str]:
    """The ``name`` of each test case that failed or errored in the JUnit file at ``path`` (for tests and
    scripts)."""
    root = ET.parse(path).getroot()
    return [c.get("name", "") for c in root.iter("testcase") if c.find("failure") is not None
            or c.find("error") is not None]
