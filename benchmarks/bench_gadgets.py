"""The gadget corpus (tests/gadgets/, issue 24) side by side: ckptaudit, picklescan, modelscan and ModelAudit.

Each of the corpus's 49 callables goes into its own ``torch.save`` file (a small state_dict plus one REDUCE
call of the gadget), twice: as a nanoGPT-style ``ckpt_0000NN.pt`` (the resume reads it with
``torch.load(weights_only=True)``) and as DeepSpeed's ``global_stepNN/mp_rank_00_model_states.pt`` (read with
``weights_only=False``: the gadget would run), beside one clean control file of each layout.  ckptaudit
audits each run folder once; each other scanner scans every file, through its own command line, from the
Python environment given with ``--scanners`` (a venv with ``picklescan``, ``modelscan`` and ``modelaudit``
installed, kept apart from the project's).

A file counts as **flagged** by a scanner when it reports an issue of its top severity for the file
(ckptaudit: an error on it; picklescan: a "dangerous" global; modelscan: a CRITICAL or HIGH issue;
ModelAudit: a "critical" issue), **warned** when it reports anything weaker, and **missed** when it reports
nothing.  Nothing is ever unpickled.

    python benchmarks/bench_gadgets.py --scanners /tmp/scanvenv/bin [--out gadgets.json]

Prints a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common as C  # noqa: E402


def build(base: Path) -> dict:
    """{file path: gadget qualname} for both layouts under ``base``."""
    import torch

    from tests.gadgets import CORPUS, PICKLE_MODULE, R, _Call

    out = {}
    plain, ds = base / "plain", base / "deepspeed"
    plain.mkdir(parents=True)
    for i, g in enumerate(CORPUS, start=1):
        state = {"model": {"w": torch.ones(4)}, "iter_num": i, "extra": _Call(R(g.module, g.name), g.args)}
        p = plain / f"ckpt_{i:06d}.pt"
        torch.save(state, p, pickle_module=PICKLE_MODULE)
        out[str(p)] = g.qualname
        d = ds / f"global_step{i}"
        d.mkdir(parents=True)
        q = d / "mp_rank_00_model_states.pt"
        torch.save({"module": {"w": torch.ones(4)}, "global_steps": i, "extra": _Call(R(g.module, g.name), g.args)},
                   q, pickle_module=PICKLE_MODULE)
        out[str(q)] = g.qualname
    for layout, name, state in (("plain", "ckpt_000999.pt", {"model": {"w": torch.ones(4)}, "iter_num": 999}),
                                ("deepspeed", "global_step999/mp_rank_00_model_states.pt",
                                 {"module": {"w": torch.ones(4)}, "global_steps": 999})):
        q = base / layout / name  # a clean control of each layout: what a scanner says with no gadget
        q.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, q)
        out[str(q)] = "(clean control)"
    return out


def ckptaudit_marks(base: Path, files: dict) -> dict:
    from ckptaudit.pipeline import audit_in_process

    marks = {}
    for layout in ("plain", "deepspeed"):
        v = audit_in_process(base / layout, {}, out_dir=base / f"audit-{layout}")
        for u in v["units"]:
            for f in u["findings"]:
                if f["layer"] != "security":
                    continue
                p = str(base / layout / (f.get("path") or u["unit"]))
                level = "flagged" if f["severity"] == "error" else "warned"
                if p in files and marks.get(p) != "flagged":
                    marks[p] = level
    return marks


def _run(cmd, timeout=120) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout + "\n" + p.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ERROR {e}"


def picklescan_marks(bindir: Path, files: dict) -> dict:
    marks = {}
    for p in files:
        text = _run([str(bindir / "picklescan"), "--path", p])
        count = {k: int(m.group(1)) if (m := re.search(rf"{k} globals: (\d+)", text)) else 0
                 for k in ("Dangerous", "Suspicious")}
        if count["Dangerous"] or re.search(r"Infected files: [1-9]", text):
            marks[p] = "flagged"
        elif count["Suspicious"]:
            marks[p] = "warned"
    return marks


def modelscan_marks(bindir: Path, files: dict, work: Path) -> dict:
    marks = {}
    for i, p in enumerate(files):
        rep = work / f"modelscan-{i}.json"
        _run([str(bindir / "modelscan"), "-p", p, "-r", "json", "-o", str(rep)])
        try:
            doc = json.loads(rep.read_text())
        except (OSError, ValueError):
            continue
        sev = {str(x.get("severity", "")).upper() for x in doc.get("issues", [])}
        if sev & {"CRITICAL", "HIGH"}:
            marks[p] = "flagged"
        elif sev:
            marks[p] = "warned"
    return marks


def modelaudit_marks(bindir: Path, files: dict, work: Path) -> dict:
    marks = {}
    for i, p in enumerate(files):
        rep = work / f"modelaudit-{i}.json"
        _run([str(bindir / "modelaudit"), "scan", p, "--format", "json", "--output", str(rep)], timeout=300)
        try:
            doc = json.loads(rep.read_text())
        except (OSError, ValueError):
            continue
        sev = {str(x.get("severity", "")).lower() for x in doc.get("issues", [])}
        if "critical" in sev:
            marks[p] = "flagged"
        elif sev - {"debug", "info", ""}:
            marks[p] = "warned"
    return marks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scanners", required=True, help="bin/ of a venv with picklescan, modelscan and modelaudit")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    bindir = Path(a.scanners)
    base = Path(tempfile.mkdtemp(prefix="bench-gadgets-"))
    files = build(base)
    work = base / "reports"
    work.mkdir()
    results = {"ckptaudit": ckptaudit_marks(base, files), "picklescan": picklescan_marks(bindir, files),
               "modelscan": modelscan_marks(bindir, files, work), "ModelAudit": modelaudit_marks(bindir, files, work)}
    rows = []
    for name, marks in results.items():
        for layout in ("plain", "deepspeed"):
            fs_ = [p for p in files if f"/{layout}/" in p and files[p] != "(clean control)"]
            ctrl = next(p for p in files if f"/{layout}/" in p and files[p] == "(clean control)")
            n = {k: sum(1 for p in fs_ if marks.get(p) == k) for k in ("flagged", "warned")}
            rows.append([name, layout, len(fs_), n["flagged"], n["warned"], len(fs_) - n["flagged"] - n["warned"],
                         marks.get(ctrl, "nothing")])
    print("### The gadget corpus (49 callables on no list), side by side\n")
    print(C.machine_line() + "\n")
    print(C.md_table(["scanner", "file", "gadget files", "flagged (top severity)", "warned", "missed",
                      "clean control"], rows))
    if a.out:
        doc = {k: {p: [files[p], v.get(p, "missed")] for p in files} for k, v in results.items()}
        Path(a.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
