"""Run ckptaudit and picklescan on the corpus; tabulate where they catch the malicious unit.

``python -m tests.security_corpus.compare --corpus DIR`` prints, per container,
how many samples each tool catches, and what ckptaudit reports instead on the
misses.  ``--write-expected`` rewrites ``expected_disagreements.json`` from
what it observes, keeping the ``why`` of rows that did not change and writing
a generated one (marked ``"generated": true``) for new rows, to be read and
corrected by hand.

*ckptaudit catches* a run when the malicious unit has a finding of layer
``security`` and severity ``error`` and ``usable_for == "none"``.
*picklescan catches* a run when ``scan_directory_path`` of the run folder
reports a Dangerous global (what ``picklescan --path RUN`` does); the file
scan (``scan_file_path`` of the malicious file) is recorded beside it.  The
clean sibling of each run holds no dangerous global, so a Dangerous global
always comes from the malicious file.

Neither tool unpickles anything: picklescan disassembles with pickletools,
ckptaudit walks pickles statically; the corpus audit runs with the load stage
off by default (``load_test=True`` turns it on: the load child opens only
units without a file or security error, with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

EXPECTED = Path(__file__).with_name("expected_disagreements.json")


# ------------------------------------------------------------------ one run


def _finding_row(f: dict) -> dict:
    d = f.get("detail") or {}
    return {"kind": f["kind"], "layer": f["layer"], "severity": f["severity"], "path": f.get("path", ""),
            "imports": list(d.get("imports") or []), "why": str(d.get("why", ""))[:300]}


def audit_run(run_dir: str, load_test: bool = False) -> dict:
    """ckptaudit's verdict on one run folder, reduced to units and findings (JSON-able)."""
    import warnings

    warnings.simplefilter("ignore")
    from ckptaudit.pipeline import audit_in_process

    cfg = {} if load_test else {"load": {"enabled": False}}
    v = audit_in_process(run_dir, cfg)
    return {"units": [{"unit": u["unit"], "usable_for": u["usable_for"],
                       "findings": [_finding_row(f) for f in u["findings"]]} for u in v["units"]],
            "recommendation": v["recommendation"]}


def picklescan_run(run_dir: str, file: str) -> dict:
    """picklescan 1.x on the run folder (directory scan) and on the malicious file alone."""
    logging.getLogger("picklescan").setLevel(logging.CRITICAL)
    from picklescan.scanner import SafetyLevel, scan_directory_path, scan_file_path

    def summary(fn, *a):
        try:
            r = fn(*a)
        except Exception as e:  # picklescan raises on some inputs; that is a miss, recorded as such
            return {"dangerous": [], "suspicious": [], "scan_err": True, "raised": f"{type(e).__name__}: {e}"[:200],
                    "scanned_files": 0}
        return {"dangerous": sorted({f"{g.module}.{g.name}" for g in r.globals if g.safety == SafetyLevel.Dangerous}),
                "suspicious": sorted({f"{g.module}.{g.name}" for g in r.globals
                                      if g.safety == SafetyLevel.Suspicious}),
                "scan_err": bool(r.scan_err), "raised": "", "scanned_files": r.scanned_files}

    return {"dir": summary(scan_directory_path, run_dir), "file": summary(scan_file_path, str(Path(run_dir) / file))}


def _one(args) -> tuple:
    run_dir, load_test = args
    truth = json.loads((Path(run_dir) / "truth.json").read_text())
    out = {"truth": truth}
    try:
        out["ckptaudit"] = audit_run(run_dir, load_test)
    except Exception as e:  # an audit that raises is a miss too, and must show
        out["ckptaudit"] = {"units": [], "recommendation": "", "raised": f"{type(e).__name__}: {e}"[:300]}
    out["picklescan"] = picklescan_run(run_dir, truth["file"])
    return Path(run_dir).name, out


def collect(corpus: Path, runs: Optional[List[str]] = None, *, workers: Optional[int] = None,
            load_test: bool = False) -> Dict[str, dict]:
    """{run: {"truth", "ckptaudit", "picklescan"}} for every run folder (truth.json) of the corpus."""
    corpus = Path(corpus)
    names = runs if runs is not None else sorted(p.name for p in corpus.iterdir() if (p / "truth.json").exists())
    jobs = [(str(corpus / n), load_test) for n in names]
    workers = workers or min(4, os.cpu_count() or 1)
    if workers <= 1:
        return dict(map(_one, jobs))
    import multiprocessing

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        return dict(ex.map(_one, jobs, chunksize=4))


# ------------------------------------------------------------------ verdicts


def malicious_unit(res: dict) -> Optional[dict]:
    return next((u for u in res["ckptaudit"]["units"] if u["unit"] == res["truth"]["unit"]), None)


def ckptaudit_caught(res: dict) -> bool:
    u = malicious_unit(res)
    return bool(u and u["usable_for"] == "none"
                and any(f["layer"] == "security" and f["severity"] == "error" for f in u["findings"]))


def picklescan_caught(res: dict, mode: str = "dir") -> bool:
    return bool(res["picklescan"][mode]["dangerous"])


def instead(res: dict) -> str:
    """What ckptaudit reports on the malicious unit when it does not catch it: 'kind (layer)', errors first."""
    u = malicious_unit(res)
    if u is None:
        return "no unit found" + (f" (audit raised {res['ckptaudit']['raised']})" if res["ckptaudit"].get("raised")
                                  else "")
    errs = [f"{f['kind']} ({f['layer']})" for f in u["findings"] if f["severity"] == "error"]
    if errs:
        return ", ".join(sorted(set(errs)))
    warns = [f"{f['kind']} ({f['layer']})" for f in u["findings"] if f["severity"] == "warning"]
    return "no error" + (f"; warnings: {', '.join(sorted(set(warns)))}" if warns else "")


def matrix(results: Dict[str, dict]) -> Dict[str, dict]:
    """Per container: samples, caught by ckptaudit / picklescan (dir, file), and ckptaudit's misses grouped."""
    out: Dict[str, dict] = {}
    for run, r in sorted(results.items()):
        t = r["truth"]
        if not t["malicious"]:
            continue
        m = out.setdefault(t["container"], {"samples": 0, "ckptaudit": 0, "picklescan_dir": 0, "picklescan_file": 0,
                                            "ckptaudit_misses": {}, "picklescan_misses": []})
        m["samples"] += 1
        m["ckptaudit"] += ckptaudit_caught(r)
        m["picklescan_dir"] += picklescan_caught(r, "dir")
        m["picklescan_file"] += picklescan_caught(r, "file")
        if not ckptaudit_caught(r):
            m["ckptaudit_misses"].setdefault(instead(r), []).append(t["sample"])
        if not picklescan_caught(r, "dir"):
            m["picklescan_misses"].append(t["sample"])
    return out


# ------------------------------------------------------------------ the disagreement table


def _ps_side(r: dict) -> str:
    t, ps = r["truth"], r["picklescan"]
    d, f = ps["dir"], ps["file"]
    if d["dangerous"]:
        return f"picklescan flags {', '.join(d['dangerous'])}"
    parts = []
    src = d
    if t["container"] == "dcp":
        parts.append("picklescan's directory scan skips .metadata (it picks files by extension)")
        if f["dangerous"]:
            return parts[0] + f"; scanned alone the file is flagged ({', '.join(f['dangerous'])})"
        src = f
        parts.append("scanned alone it is not flagged either")
    if src["raised"]:
        parts.append(f"picklescan raised: {src['raised']}")
    elif t["sample"].startswith("ext"):
        parts.append("picklescan does not resolve EXT1/EXT2/EXT4 registry codes and copyreg.add_extension is off its "
                     "denylist (Suspicious)")
    else:
        sus = [g for g in src["suspicious"] if not g.startswith(_FRAMEWORK_PREFIXES)] or src["suspicious"]
        if any(g.split(".", 1)[0].isdigit() for g in sus):
            parts.append("picklescan reads the STACK_GLOBAL operands fetched from the memo as the memo indexes "
                         f"({', '.join(sus)}: Suspicious, not Dangerous)")
        elif sus:
            parts.append(f"picklescan sees only names off its denylist ({', '.join(sus[:4])}: Suspicious, "
                         "not Dangerous)")
        else:
            parts.append("picklescan finds no global")
    return "; ".join(parts)


_FRAMEWORK_PREFIXES = ("torch._utils.", "torch.FloatStorage", "collections.", "transformers.", "accelerate.",
                       "numpy.", "_codecs.", "torch.device")


def _ck_cause(r: dict) -> str:
    """Why ckptaudit's walk never saw the payload, from the container and what the audit reported."""
    t = r["truth"]
    u = malicious_unit(r) or {"findings": []}
    kinds = {f["kind"] for f in u["findings"] if f["severity"] == "error"}
    sid = t["sample"]
    if t["container"] == "raw":
        return ("a raw pickle under a checkpoint name is rejected by the file layer "
                f"({'protocol 0 is text' if 'text_error_page' in kinds else ', '.join(sorted(kinds))}) "
                "and never reaches the security walk")
    if t["container"] in ZIP_TRICK_CONTAINERS:
        return f"the file-layer error ({', '.join(sorted(kinds))}) stops the scan before data.pkl is walked"
    if sid.startswith("multistream"):
        return "only the first pickle stream of the member is walked, and the payload is the second"
    if t["container"] == "legacy":
        slot = t.get("legacy_slot", 3)
        if slot == 0:
            return ("record 1 is not the literal magic number, so the file is not taken for a legacy torch file "
                    f"({', '.join(sorted(kinds))}) and no record is walked")
        return (f"only the object record (4 of 5) is walked; the payload is record {slot + 1} "
                f"({t['member'].split('(')[-1].rstrip(')')})"
                + (f", which fails its own check ({', '.join(sorted(kinds))})" if kinds else ", never checked"))
    return ", ".join(sorted(kinds)) or "no error"


ZIP_TRICK_CONTAINERS = ("torchzip_crc", "torchzip_flagbits", "torchzip_localname")


def _ck_side(r: dict) -> str:
    if ckptaudit_caught(r):
        u = malicious_unit(r)
        ks = sorted({f["kind"] for f in u["findings"] if f["layer"] == "security" and f["severity"] == "error"})
        imps = sorted({i for f in u["findings"] if f["layer"] == "security" for i in f["imports"]})
        only_unknown = " [only unknown_pickle_global: an error today because every unknown import is one]" \
            if ks == ["unknown_pickle_global"] else ""
        return f"ckptaudit reports {', '.join(ks)}" + (f" ({', '.join(imps[:4])})" if imps else "") + only_unknown
    return f"ckptaudit misses it ({instead(r)}): {_ck_cause(r)}"


def disagreements(results: Dict[str, dict]) -> Dict[str, dict]:
    """{run: {"ckptaudit": bool, "picklescan": bool, "why": str}} for every malicious run where the tools differ."""
    out = {}
    for run, r in sorted(results.items()):
        if not r["truth"]["malicious"]:
            continue
        ck, ps = ckptaudit_caught(r), picklescan_caught(r, "dir")
        if ck != ps:
            out[run] = {"ckptaudit": ck, "picklescan": ps, "why": f"{_ck_side(r)}; {_ps_side(r)}"}
    return out


def load_expected(path: Path = EXPECTED) -> Dict[str, dict]:
    doc = json.loads(path.read_text())
    return doc["rows"]


def write_expected(observed: Dict[str, dict], path: Path = EXPECTED) -> None:
    old = load_expected(path) if path.exists() else {}
    rows = {}
    for run, row in observed.items():
        prev = old.get(run)
        if prev and prev["ckptaudit"] == row["ckptaudit"] and prev["picklescan"] == row["picklescan"]:
            rows[run] = prev
        else:
            rows[run] = {**row, "generated": True}
    doc = {
        "about": ("Runs of the security corpus where ckptaudit and picklescan disagree on the malicious unit. "
                  "ckptaudit: the unit has a security error and usable_for none. picklescan: "
                  "scan_directory_path(run) reports a Dangerous global. Regenerate with "
                  "`python -m tests.security_corpus.compare --corpus DIR --write-expected` after changing "
                  "ckptaudit, then read every row marked generated and correct its why."),
        "observed_with": _observed_with(),
        "picklescan_version": _picklescan_version(),
        "rows": rows,
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _observed_with() -> str:
    """The ckptaudit commit the table was observed with (and whether ckptaudit/ had uncommitted changes)."""
    import subprocess

    import ckptaudit

    root = Path(ckptaudit.__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=20).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "ckptaudit"], capture_output=True,
                               text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head, dirty = "", ""
    import torch

    return (f"ckptaudit at commit {head or '?'}{' with uncommitted changes' if dirty else ''}, picklescan "
            f"{_picklescan_version()}, torch {torch.__version__}")


def _picklescan_version() -> str:
    try:
        from importlib.metadata import version

        return version("picklescan")
    except Exception:  # pragma: no cover
        return "?"


# ------------------------------------------------------------------ command line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.security_corpus.compare")
    ap.add_argument("--corpus", required=True, help="a folder written by python -m tests.security_corpus.make")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--load-test", action="store_true", help="audit with the load stage on")
    ap.add_argument("--write-expected", action="store_true")
    ap.add_argument("--json", help="write every run's raw results to this file")
    a = ap.parse_args(argv)
    res = collect(Path(a.corpus), workers=a.workers, load_test=a.load_test)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, sort_keys=True))
    for c, m in matrix(res).items():
        print(f"{c}: {m['samples']} samples; ckptaudit catches {m['ckptaudit']}, picklescan {m['picklescan_dir']} "
              f"(dir scan) / {m['picklescan_file']} (file scan)")
        for why, ids in sorted(m["ckptaudit_misses"].items(), key=lambda kv: -len(kv[1])):
            print(f"    ckptaudit miss x{len(ids)}: {why}")
    obs = disagreements(res)
    print(f"{len(obs)} disagreements")
    if a.write_expected:
        write_expected(obs)
        print(f"wrote {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
