"""The report stage: join the parts into tables, ``verdict.json``, ``units.parquet``
and one self-contained ``report.html`` (inline CSS, no scripts, no fonts —
it is attached to postmortems and opened offline)."""

from __future__ import annotations

import datetime as _dt
import glob
import json
import os
from pathlib import Path
from typing import Dict, List, Optional

from .. import tables, verdict
from .._version import __version__
from .._io import atomic_write
from .context import StageContext

STAGES = ("hash", "scan", "tensors", "imports", "load", "structure", "configdiff", "state")
#: Tables with a row per tensor or per import: concatenated into tables/ a batch at a time, never read here.
ROW_PER_TENSOR = ("tensors", "imports")
LAYERS = ("file", "structure", "state", "security")


#: rules whose benchmark files are not the audit's cost: the demo rule trains the run the audit then reads
NOT_AUDIT_STAGES = ("demo",)
#: helper rules counted in the stage they serve (the README's table lists stages, not rules)
STAGE_OF_RULE = {"target": "structure"}


def stage_costs(bench_dir: str, work_dir: Optional[str] = None) -> List[dict]:
    """Per-stage cost of the audit from Snakemake ``benchmark:`` files (seconds, max RSS MiB); the rules of
    :data:`NOT_AUDIT_STAGES` are left out, those of :data:`STAGE_OF_RULE` counted in the stage they serve.  A job
    that ran in the stage job server (``work_dir``'s :data:`ckptaudit.stages.jobs.costs.JOBS_NAME`) has its max RSS
    from its forked child, whose memory the benchmark file (of the job's waiting process) does not see."""
    from .jobs.costs import job_costs

    forked = job_costs(work_dir) if work_dir else {}
    out: Dict[str, dict] = {}
    for p in sorted(glob.glob(os.path.join(bench_dir, "*", "*.tsv")) + glob.glob(os.path.join(bench_dir, "*.tsv"))):
        stage = Path(p).parent.name if Path(p).parent != Path(bench_dir) else Path(p).stem
        if stage in NOT_AUDIT_STAGES:
            continue
        job = forked.get((stage, Path(p).stem), {})
        stage = STAGE_OF_RULE.get(stage, stage)
        try:
            lines = Path(p).read_text().splitlines()
            head, vals = lines[0].split("\t"), lines[1].split("\t")
            d = dict(zip(head, vals))
            c = out.setdefault(stage, {"stage": stage, "jobs": 0, "seconds": 0.0, "max_rss": 0.0})
            c["jobs"] += 1
            c["seconds"] += float(d.get("s", 0) or 0)
            # max_rss sums the job's processes (shared torch pages counted twice); PSS does not
            rss = d.get("max_pss", d.get("max_rss", "-"))
            c["max_rss"] = max(c["max_rss"], float(rss) if rss not in ("-", "NA", "") else 0.0,
                               float(job.get("max_rss_mib") or 0.0))
        except (OSError, IndexError, ValueError):
            continue
    for c in out.values():
        c["max_rss"] = f"{c['max_rss']:.0f} MiB" if c["max_rss"] else "-"
    return list(out.values())


def render_html(v: dict, all_tables: Dict[str, List[dict]], run_name: str, costs: List[dict],
                inventory_units: Optional[List[dict]] = None) -> str:
    """report.html: the headline, the charts (:mod:`ckptaudit.charts`) and the tables, in one page."""
    from .. import charts
    from ..outputs import report_cells, report_headline, templating

    units = inventory_units or []
    cells = report_cells.layer_cells(v, all_tables, LAYERS)
    late = charts.timeline.late_writes(v.get("units", []), charts.mtimes_of(units))
    state_why = {u: c["state"]["why"] for u, c in cells.items() if c["state"]["status"] == "not-checked"}
    return templating.render(
        "report.html.j2",
        verdict=v, run_name=run_name, layers=LAYERS, version=__version__,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        state_rows=all_tables.get("state", []), load_rows=all_tables.get("load", []),
        hash_rows=all_tables.get("hash", []), stage_costs=costs, cells=cells,
        headline=report_headline.headline(v, late),
        charts=charts.report_charts(v, units, all_tables, costs, state_why),
        yn=lambda x: "yes" if x else ("no" if x is not None else ""),
        mib=templating.mib,
    )


def run_report(inventory_json: str, parts: Dict[str, List[str]], cfg: dict, out_dir: str,
               bench_dir: str = "", audit_id: Optional[str] = None, reuse: bool = False,
               verify_plan: Optional[str] = None) -> dict:
    """Concatenate part tables into ``out_dir/tables``; write verdict.json,
    units.parquet (in tables/) and report.html.  Returns the verdict.

    ``audit_id`` (:func:`ckptaudit.verification.reverify.audit_id`) and ``reuse`` say which units this audit re-verified:
    the verdict's ``bytes_verified`` and each unit's ``last_hashed_utc`` / ``reverified``; ``verify_plan``
    (a ``verify_budget`` audit's plan): the budget, and each unit's ``last_verified_utc`` and ``verification_note``
    (:func:`ckptaudit.verification.budget.annotate`)."""
    with open(inventory_json) as f:
        inv = json.load(f)
    tdir = Path(out_dir) / "tables"
    all_tables: Dict[str, List[dict]] = {}
    for stage in STAGES:
        if stage in ROW_PER_TENSOR:  # only copied to tables/: no Python row per tensor (issue 22)
            tables.concat_batches(stage, parts.get(stage, []), tdir / f"{stage}.parquet")
        else:
            all_tables[stage] = tables.concat(stage, parts.get(stage, []), tdir / f"{stage}.parquet")
    from .. import fs

    ctx = StageContext(fs.path(inv["run_dir"]), inv, cfg, verify_plan=verify_plan)
    return write_report(ctx, all_tables, out_dir, bench_dir, audit_id, reuse)


def write_report(ctx: StageContext, all_tables: Dict[str, List[dict]], out_dir: str | Path,
                 bench_dir: str = "", audit_id: Optional[str] = None, reuse: bool = False) -> dict:
    """verdict.json, ``units.parquet`` and ``pointers.parquet`` (in ``out_dir/tables``) and report.html of the
    audit of ``ctx`` (its inventory, config and ``verify_plan``) from the stages' rows ``all_tables`` ({table:
    rows} of :data:`STAGES` but :data:`ROW_PER_TENSOR`, already written to ``out_dir/tables``); the other
    arguments as :func:`run_report`'s.  Returns the verdict."""
    from . import liveness

    out = Path(out_dir)
    tdir = out / "tables"
    cfg, verify_plan, root = dict(ctx.config), ctx.verify_plan, ctx.run_dir
    inv = {**ctx.inventory, "changed_during_audit": {}}
    for u in inv["units"]:
        changed = liveness.changed_files(root, u.get("snapshot") or {})
        if changed:
            inv["changed_during_audit"][u["unit"]] = [liveness.changed_finding(u["unit"], changed, root).to_dict()]
    v = verdict.build(inv, all_tables, cfg)
    _add_reverified(v, all_tables.get("hash", []), audit_id, reuse)
    from ..verification.budget import annotate

    annotate(v, all_tables.get("hash", []), verify_plan, audit_id)  # "not verified since <date>", never "verified"
    from ..salvage_option import offer

    mtimes = {u["unit"]: u.get("mtime_ns") for u in inv["units"]}
    for u in v["units"]:  # when the unit was written: its files' newest mtime (for --metrics' unit age)
        u["mtime_unix"] = mtimes[u["unit"]] / 1e9 if mtimes.get(u["unit"]) is not None else None
    v["salvage"] = offer(v, root, out, cfg)
    if v["salvage"]:
        v["reasons"].append(v["salvage"]["sentence"])
    sizes = {u["unit"]: u["size_bytes"] for u in inv["units"]}
    tables.write("units", verdict.units_rows(v, sizes), tdir / "units.parquet")
    ptr_rows = []
    by_path = {p["path"]: p for p in inv.get("pointers", [])}
    for p in v["pointers"]:
        src = by_path.get(p["path"], {})
        f = next((x for x in v["pointer_findings"] if x.get("path") == p["path"]), None)
        ptr_rows.append({"path": p["path"], "kind": src.get("kind", ""), "target": p["target"],
                         "resolved": src.get("resolved", ""), "exists": src.get("exists"),
                         "is_symlink": src.get("is_symlink"), "ok": p["ok"], "finding_kind": p["kind"],
                         "findings_json": json.dumps([f] if f else [])})
    tables.write("pointers", ptr_rows, tdir / "pointers.parquet")
    from ..schemas import check_verdict

    check_verdict(v)
    _write_json(out / "verdict.json", v)
    run_name = cfg.get("run_name") or Path(inv["run_dir"].rstrip("/")).name
    costs = stage_costs(bench_dir, str(out / "work")) if bench_dir else []
    html = render_html(v, all_tables, run_name, costs, inv["units"])
    atomic_write(out / "report.html", html.encode())
    return v


def _add_reverified(v: dict, hash_rows: List[dict], audit_id: Optional[str], reuse: bool) -> None:
    """``v["bytes_verified"]``: this audit's start, ``reuse``, how many units it hashed again or reused and how
    many files have a digest of each algorithm (``digest_algorithms``); each unit's ``last_hashed_utc`` (its least
    recently hashed file), ``reverified`` (hashed by this audit) and ``digests`` (``{"file", "digest_algorithm",
    "digest_hex"}`` of each file with one: SHA-256 where something records one, else the audit's own BLAKE3,
    :mod:`ckptaudit.formats.digest_purpose`)."""
    from ..verification import reverify

    s = reverify.summary(hash_rows, audit_id, reuse)
    last = s.pop("last_hashed_utc")
    digests: Dict[str, List[dict]] = {}
    algorithms: Dict[str, int] = {}
    for r in hash_rows:
        if r.get("digest_hex"):
            digests.setdefault(r["unit"], []).append(
                {"file": r["file"], "digest_algorithm": r["digest_algorithm"], "digest_hex": r["digest_hex"]})
            algorithms[r["digest_algorithm"]] = algorithms.get(r["digest_algorithm"], 0) + 1
    v["bytes_verified"] = {**s, "digest_algorithms": dict(sorted(algorithms.items()))}
    start = s["audit_started_utc"] or ""
    for u in v.get("units", []):
        t = last.get(u["unit"])
        u["last_hashed_utc"] = t
        u["reverified"] = bool(t) and t >= start
        u["digests"] = digests.get(u["unit"], [])


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json_text(doc).encode())


def json_text(doc: dict) -> str:
    """``doc`` (verdict.json) as JSON text: one top-level key a line, each element of a top-level list on a line of
    its own (a unit, a finding, a reason: what ``grep`` and a diff of two nights find), every other value indented
    by two.  The same document as ``json.dumps(doc, indent=2)``; its elements go through the C encoder, which the
    standard library uses only without ``indent`` (10,000 units: 0.64 s with ``indent=2``)."""
    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v:
            items = ",\n".join("    " + json.dumps(e, default=str) for e in v)
            body = f"[\n{items}\n  ]"
        else:
            body = json.dumps(v, indent=2, default=str).replace("\n", "\n  ")
        lines.append(f"  {json.dumps(k)}: {body}")
    return "{\n" + ",\n".join(lines) + "\n}\n" if lines else "{}\n"


def main(argv=None) -> int:
    from .jobs.process import job_memory_pool, without_pandas

    without_pandas()
    job_memory_pool()
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ckptaudit.stages report")
    ap.add_argument("--inventory", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--bench-dir", default="")
    ap.add_argument("--audit-id", default=os.environ.get("CKPTAUDIT_AUDIT_ID"),
                    help="this audit's id (ckptaudit.verification.reverify.audit_id; default: $CKPTAUDIT_AUDIT_ID, which the "
                         "workflow sets for its jobs)")
    ap.add_argument("--reuse", action="store_true", help="the audit re-used unchanged parts (config reuse)")
    ap.add_argument("--verify-plan", default=None, help="work/verify_plan.json of a verify_budget audit")
    for s in STAGES:
        ap.add_argument(f"--{s}", nargs="*", default=[])
    a = ap.parse_args(argv)
    with open(a.config) as f:
        cfg = json.load(f)
    parts = {s: getattr(a, s) for s in STAGES}
    run_report(a.inventory, parts, cfg, a.out_dir, a.bench_dir, a.audit_id, a.reuse, a.verify_plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
