"""verify_budget (issue 45): a nightly that re-reads the least recently verified units and reuses the rest."""

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ckptaudit.verification import budget as vb
from ckptaudit.verification import ledger as vl

CLI = [sys.executable, "-m", "ckptaudit.cli"]
MB = 1313243  # bytes of each full unit of the demo run (max_steps 300, save_every 50)


# ------------------------------------------------------------------ the budget's text


@pytest.mark.parametrize("text, n_bytes, seconds", [
    ("2TiB", 2 * 2 ** 40, None), ("500GB", 500 * 10 ** 9, None), ("1.5MiB", 1572864, None), ("1048576", 1048576, None),
    ("3h", None, 10800.0), ("45m", None, 2700.0), ("90s", None, 90.0), ("1d", None, 86400.0)])
def test_budget_is_bytes_or_a_duration(text, n_bytes, seconds):
    assert vb.parse_budget(text) == vb.Budget(text, bytes=n_bytes, seconds=seconds)


def test_no_budget_and_bad_budgets():
    assert vb.parse_budget("") is None and vb.parse_budget("  ") is None
    for bad in ("2 furlongs", "-3h", "nan", "TiB"):
        with pytest.raises(ValueError) as e:
            vb.parse_budget(bad)
        assert str(e.value) == f"verify_budget {bad!r}: expected bytes (e.g. 2TiB, 500GB) or a duration (e.g. 3h, 45m)"


def test_a_duration_is_read_at_the_rate_of_earlier_passes():
    ledger = {"a": {"rows": [{"file": "a", "size_bytes": 3_000_000, "hash_seconds": 2.0},
                             {"file": "b", "size_bytes": 1_000_000, "hash_seconds": 2.0}]}}
    assert vb.rate_bytes_per_s(ledger) == 1_000_000.0
    assert vb.parse_budget("1m").to_bytes(vb.rate_bytes_per_s(ledger)) == 60_000_000
    assert vb.rate_bytes_per_s({}) == vb.DEFAULT_RATE_BYTES_PER_S


# ------------------------------------------------------------------ the choice


def entry(day: str, key=("k",), files=("f",)) -> dict:
    rows = [{"file": f, "size_bytes": 10, "hashed_at_utc": f"2026-11-{day}T00:00:00+00:00"} for f in files]
    return {"keys": {"f": list(key)}, "rows": rows, "recorded_utc": f"2026-11-{day}"}


def test_units_are_chosen_new_and_changed_first_then_oldest_verified():
    units = [{"unit": n, "files": ["f"], "size_bytes": 10} for n in ("u1", "u2", "u3", "u4", "u5", "u6")]
    ledger = {"u1": entry("05"), "u2": entry("01"), "u3": entry("03"), "u4": entry("02"), "u6": entry("04")}
    keys = {n: {"f": ["k"]} for n in ("u1", "u2", "u3", "u4", "u5")}
    keys["u6"] = {"f": ["k2"]}  # its file changed since it was verified (another ctime)
    plan = vb.make_plan(units, ledger, keys, vb.Budget("40B", bytes=40))
    why = {n: (p["verify"], p["why"]) for n, p in plan["units"].items()}
    assert why == {"u5": (True, "new"), "u6": (True, "changed"), "u2": (True, "oldest"), "u4": (True, "oldest"),
                   "u3": (False, "outside budget"), "u1": (False, "outside budget")}
    assert (plan["chosen_bytes"], plan["budget_bytes"], plan["over_budget"]) == (40, 40, False)
    assert plan["units"]["u3"]["last_verified_utc"] == "2026-11-03T00:00:00+00:00"


def test_a_part_is_read_whole_and_aged_by_its_least_recently_verified_unit():
    """A part's one pass feeds its scan and state: reading only some of its units would have them read the rest."""
    units = [{"unit": n, "files": ["f"], "size_bytes": 10, "part": p}
             for n, p in (("a1", "p0"), ("a2", "p0"), ("b1", "p1"), ("b2", "p1"), ("c1", "p2"), ("c2", "p2"))]
    ledger = {"a1": entry("09"), "a2": entry("08"), "b1": entry("02"), "b2": entry("07"), "c2": entry("01")}
    keys = {n: {"f": ["k"]} for n in ("a1", "a2", "b1", "b2", "c1", "c2")}
    plan = vb.make_plan(units, ledger, keys, vb.Budget("40B", bytes=40))
    why = {n: (p["verify"], p["why"]) for n, p in plan["units"].items()}
    assert why == {"c1": (True, "new"), "c2": (True, "same part"), "b1": (True, "oldest"), "b2": (True, "oldest"),
                   "a1": (False, "outside budget"), "a2": (False, "outside budget")}
    day = "2026-11-{}T00:00:00+00:00".format
    assert plan["parts"] == {"p0": {"verify": False, "size_bytes": 20, "last_verified_utc": day("08")},
                             "p1": {"verify": True, "size_bytes": 20, "last_verified_utc": day("02")},
                             "p2": {"verify": True, "size_bytes": 20, "last_verified_utc": None}}
    plan["tokens"] = {"p0": "", "p1": "aid"}  # as plan_for_audit sets them
    assert vb.part_token(plan, "p0") == "" and vb.part_token(plan, "p1") == " verified-by aid"


def test_a_part_keeps_the_token_of_the_audit_that_last_read_it(tmp_path):
    """A part's Snakemake key changes only when an audit reads it, so the parts a budget skips do not run."""
    run, work = tmp_path / "run", tmp_path / "work"
    run.mkdir()
    units = []
    for name, part in (("a.pt", "p0000"), ("b.pt", "p0001")):
        (run / name).write_bytes(b"x" * 10)
        units.append({"unit": name, "files": [name], "size_bytes": 10, "part": part})
    inv = {"run_dir": str(run), "units": units, "parts": {"p0000": ["a.pt"], "p0001": ["b.pt"]}}

    def verified(u, day, recorded):
        return {u["unit"]: {"keys": vl.unit_keys(str(run), u), "recorded_utc": recorded,
                            "rows": [{"file": u["unit"], "size_bytes": 10,
                                      "hashed_at_utc": f"2026-{day}T00:00:00+00:00"}]}}

    vl.write_fragment(work / "verified" / "p0000.json", verified(units[0], "11-01", "1"))
    vl.write_fragment(work / "verified" / "p0001.json", verified(units[1], "11-02", "1"))
    budget = vb.Budget("10B", bytes=10)
    first = vb.plan_for_audit(inv, work, budget, "A1", True)
    assert first["tokens"] == {"p0000": "A1", "p0001": ""}  # a.pt is the older
    assert list((work / "verified").glob("*.json")) == [] and set(vl.load_ledger(work)) == {"a.pt", "b.pt"}
    vl.write_fragment(work / "verified" / "p0000.json", verified(units[0], "12-05", "2"))  # as A1's hash job does
    second = vb.plan_for_audit(inv, work, budget, "A2", True)
    assert second["tokens"] == {"p0000": "A1", "p0001": "A2"}
    assert vb.plan_for_audit(inv, work, budget, "A2", False) == second  # a cluster job reads it
    with pytest.raises(RuntimeError):
        vb.plan_for_audit(inv, work, budget, "A3", False)


def test_a_unit_bigger_than_the_budget_is_still_read_when_it_is_the_oldest():
    units = [{"unit": "big", "files": ["f"], "size_bytes": 100}, {"unit": "small", "files": ["f"], "size_bytes": 5}]
    ledger = {"big": entry("01"), "small": entry("02")}
    keys = {"big": {"f": ["k"]}, "small": {"f": ["k"]}}
    plan = vb.make_plan(units, ledger, keys, vb.Budget("10B", bytes=10))
    assert {n: p["verify"] for n, p in plan["units"].items()} == {"big": False, "small": True}  # small fits
    plan = vb.make_plan(units[:1], ledger, keys, vb.Budget("10B", bytes=10))
    assert plan["units"]["big"]["verify"] is True and plan["over_budget"] is True  # else never verified again


def test_rows_are_carried_only_under_the_same_strong_key_with_a_previous_digest():
    e = entry("01", files=("f", "g"))
    assert vl.carried_rows(e, {"f": ["k"]}, ["f", "g"]) == e["rows"]
    assert vl.carried_rows(e, {"f": ["k", "ctime changed"]}, ["f", "g"]) is None
    assert vl.carried_rows(e, {"f": ["k"]}, ["f", "g", "h"]) is None  # h has no previous digest
    e["rows"][1]["hashed_at_utc"] = None  # g was unreadable last time
    assert vl.carried_rows(e, {"f": ["k"]}, ["f", "g"]) is None
    assert vl.carried_rows(None, {"f": ["k"]}, ["f"]) is None


def test_a_unit_not_read_by_this_audit_is_never_called_verified():
    start = "2026-12-05T02:00:00+00:00"
    assert vb.unit_verification("2026-12-05T02:00:01+00:00", start) == ""
    assert vb.unit_verification("2026-11-03T07:42:10+00:00", start) == "not verified since 2026-11-03 07:42 UTC"
    assert vb.unit_verification(None, start) == "never verified"


def test_the_verification_metrics_of_a_verdict():
    v = {"bytes_verified": {"verified_bytes": 123, "verify_budget_bytes": 1000},
         "units": [{"last_verified_utc": "2026-12-01T00:00:00+00:00"}, {"last_verified_utc": None},
                   {"last_verified_utc": "2026-12-04T00:00:00+00:00"}]}
    now = datetime.fromisoformat("2026-12-05T00:00:00+00:00").timestamp()
    assert vb.metric_values(v, now) == {"ckptaudit_units_never_verified": 1.0, "ckptaudit_verified_bytes": 123.0,
                                        "ckptaudit_unit_oldest_verification_age_seconds": 4 * 86400.0,
                                        "ckptaudit_verify_budget_bytes": 1000.0}
    v["bytes_verified"]["verify_budget_bytes"] = None  # no budget: no budget series
    assert "ckptaudit_verify_budget_bytes" not in vb.metric_values(v, now)


def test_a_digest_that_changed_under_an_unchanged_strong_key_is_bit_rot(tmp_path):
    """Without a sidecar nothing else checks a file's bytes: its last verification's digest does."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a.safetensors").write_bytes(b"x" * 64)
    inv = {"run_dir": str(tmp_path / "run"), "units": []}
    unit = {"unit": "a.safetensors", "files": ["a.safetensors"]}
    then = {"file": "a.safetensors", "size_bytes": 64, "digest_algorithm": "blake3", "digest_hex": "aa" * 32,
            "findings_json": "[]",
            "hashed_at_utc": "2026-11-03T07:42:10+00:00"}
    frag = tmp_path / "work" / "verified" / "p0000.json"
    keys = vl.unit_keys(inv["run_dir"], unit)
    vl.write_fragment(frag, {"a.safetensors": {"keys": keys, "rows": [then], "recorded_utc": "2026-11-03"}})
    split = vb.JobSplit(inv, [unit], None, frag)
    now = {**then, "digest_hex": "bb" * 32, "hashed_at_utc": "2026-12-05T02:00:00+00:00"}
    split.done("a.safetensors", [now], "2026-12-05T02:00:00+00:00")
    (f,) = json.loads(now["findings_json"])
    assert f["kind"] == "digest_changed_unseen" and f["severity"] == "error" and f["caps"] == "none"
    assert f["message"].startswith(f"a.safetensors: its digest is {'bb' * 32} but was {'aa' * 32} when its bytes "
                                   "were last verified (2026-11-03 07:42:10 UTC), and its size, mtime, ctime, inode")
    split.write(frag)  # tonight's digest is the one the next audit compares with
    assert vl.load_ledger(tmp_path / "work")["a.safetensors"]["rows"][0]["digest_hex"] == "bb" * 32

    # a file rewritten (another ctime or inode) has a new digest by right: no finding
    vl.write_fragment(frag, {"a.safetensors": {"keys": {"a.safetensors": [64, 1, 2, 3, 4]}, "rows": [then],
                                               "recorded_utc": "2026-11-03"}})
    split = vb.JobSplit(inv, [unit], None, frag)
    now = {**then, "sha256_hex": "bb" * 32}
    split.done("a.safetensors", [now], "2026-12-05T02:00:00+00:00")
    assert now["findings_json"] == "[]"


# ------------------------------------------------------------------ audits of a real run


def run_cli(*args):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=600)


def flip_keeping_times(path: Path) -> None:
    """One byte in the middle inverted, size and mtime put back with os.utime (as tests/test_rerun.py)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def verdict(out: Path) -> dict:
    return json.loads((out / "verdict.json").read_text())


def hash_bytes_read(out: Path, since_ns: int = 0) -> int:
    """Bytes the hash jobs read from the run (their own count: ckptaudit.fs.stage_bytes); ``since_ns``: only the
    jobs that ran after then (a part an audit did not run keeps its earlier count)."""
    return sum(json.loads(p.read_text())["total"] for p in (out / "work" / "bytes" / "hash").glob("*.json")
               if p.stat().st_mtime_ns > since_ns)


def errors(v: dict, unit: str) -> list:
    u = next(x for x in v["units"] if x["unit"] == unit)
    return sorted(f["kind"] for f in u["findings"] if f["severity"] == "error")


def age_ledger(out: Path, run: Path, days: dict, rotted=()) -> None:
    """Date each unit's last verification ``days[unit]`` (November 2026) in the ledger; for ``rotted`` units also
    record today's strong key, as if their bytes had changed below the file system (no ctime moves there:
    a test cannot rot a disk, so it makes the ledger blind to the flip instead)."""
    work = out / "work"
    ledger = vl.load_ledger(work)
    inv = json.loads((work / "inventory.json").read_text())
    for u in inv["units"]:
        e = ledger[u["unit"]]
        for r in e["rows"]:
            r["hashed_at_utc"] = f"2026-11-{days[u['unit']]}T00:00:00+00:00"
        if u["unit"] in rotted:
            e["keys"] = vl.unit_keys(str(run), u)
    vl.write_ledger(work, ledger)


def test_a_budgeted_nightly_reads_the_oldest_catches_rot_there_and_dates_the_rest(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run.run_dir, run)
    out = tmp_path / "audit"
    one_per_part = tmp_path / "one-per-part.yaml"
    one_per_part.write_text("units_per_job: 1\n")  # parts of one unit each ("auto" packs the demo's in one)
    audit = ("audit", str(run), "--out", str(out), "--cores", "2", "--config", str(one_per_part))
    sizes = {p.name: p.stat().st_size for p in run.iterdir()}

    # without a budget every byte of every file is read, as before
    assert run_cli(*audit).returncode == 1
    v = verdict(out)
    assert v["bytes_verified"]["verify_budget"] is None and v["bytes_verified"]["units_reverified"] == 6
    assert all(u["verification_note"] == "" and u["last_verified_utc"] for u in v["units"])
    assert hash_bytes_read(out) >= sum(sizes.values())
    assert v["bytes_verified"]["verified_bytes"] == sum(s for n, s in sizes.items() if n.endswith(".pt"))
    assert v["rollback"] == {"unit": "ckpt_000250.pt", "step": 250}

    # the first audit with a budget: every part's Snakemake key changes (it had this audit's id), so every part's
    # scan runs again once; the hash jobs read the oldest part only (nothing fits in 1 byte: over budget)
    p = run_cli(*audit, "--verify-budget", "1")
    assert p.returncode == 1, p.stdout + p.stderr
    v = verdict(out)
    assert v["bytes_verified"]["over_budget"] is True and v["bytes_verified"]["units_reverified"] == 1
    assert v["bytes_verified"]["verified_bytes"] in (MB, sizes["ckpt_000300.pt"]) and hash_bytes_read(out) < 2 * MB

    # ages: 200 oldest, then 100, 250, 050, 150, 300; 100 (inside the budget) and 250 (outside) rot unseen by stat
    days = {"ckpt_000200.pt": "01", "ckpt_000100.pt": "02", "ckpt_000250.pt": "03", "ckpt_000050.pt": "04",
            "ckpt_000150.pt": "05", "ckpt_000300.pt": "06"}
    flip_keeping_times(run / "ckpt_000100.pt")
    flip_keeping_times(run / "ckpt_000250.pt")
    age_ledger(out, run, days, rotted=("ckpt_000100.pt", "ckpt_000250.pt"))

    prom = tmp_path / "ckptaudit.prom"
    p = run_cli(*audit, "--verify-budget", str(2 * MB), "--metrics", str(prom))
    assert p.returncode == 1, p.stdout + p.stderr
    v = verdict(out)
    units = {u["unit"]: u for u in v["units"]}
    assert {n for n, u in units.items() if u["reverified"]} == {"ckpt_000200.pt", "ckpt_000100.pt"}  # the 2 oldest
    plan_file = out / "work" / "verify_plan.json"
    assert hash_bytes_read(out, plan_file.stat().st_mtime_ns) < 3 * MB  # two units' bytes, not six
    plan = json.loads(plan_file.read_text())
    read_parts = {p for p, x in plan["parts"].items() if x["verify"]}
    assert read_parts == {plan["units"][u]["part"] for u in ("ckpt_000200.pt", "ckpt_000100.pt")}
    part_250 = plan["units"]["ckpt_000250.pt"]["part"]
    for stage in ("hash", "scan", "state"):  # no stage of the other parts ran, so none read their bytes ...
        ran = {p.stem for p in (out / "work" / "bytes" / stage).glob("*.json")
               if p.stat().st_mtime_ns > plan_file.stat().st_mtime_ns}
        # ... but 250's, whose ctime the test's flip moved (a rotting disk's does not): its hash job kept its rows
        assert ran - {part_250} == read_parts, stage
    assert v["bytes_verified"]["verified_bytes"] == 2 * MB and v["bytes_verified"]["verify_budget_bytes"] == 2 * MB
    # verified tonight: the flip is caught, by its sidecar and by its last verification's digest
    assert {"checksum_mismatch", "digest_changed_unseen"} <= set(errors(v, "ckpt_000100.pt"))  # zip CRC too
    assert units["ckpt_000100.pt"]["usable_for"] == "none" and units["ckpt_000100.pt"]["verification_note"] == ""
    # outside the budget: dated, never called verified
    assert units["ckpt_000250.pt"]["verification_note"] == "not verified since 2026-11-03 00:00 UTC"
    assert units["ckpt_000250.pt"]["last_verified_utc"] == "2026-11-03T00:00:00+00:00"
    assert units["ckpt_000250.pt"]["reverified"] is False
    assert v["bytes_verified"]["oldest_verification_utc"] == "2026-11-03T00:00:00+00:00"
    assert ("  verify budget 2626486: read 2 of 6 units (2.5 MiB); 4 not verified by this audit, the oldest not "
            "since 2026-11-03 00:00 UTC") in p.stdout
    html = (out / "report.html").read_text()
    assert "(bytes not verified since 2026-11-03 00:00 UTC)" in html and 'id="verify-budget"' in html
    m = {s.name: s.value for fam in text_string_to_metric_families(prom.read_text()) for s in fam.samples}
    assert m["ckptaudit_verified_bytes"] == 2 * MB and m["ckptaudit_verify_budget_bytes"] == 2 * MB
    assert m["ckptaudit_units_never_verified"] == 0
    oldest = datetime.fromisoformat("2026-11-03T00:00:00+00:00").timestamp()
    assert abs(m["ckptaudit_unit_oldest_verification_age_seconds"] - (time.time() - oldest)) < 600
    assert plan["units"]["ckpt_000250.pt"] == {"verify": False, "why": "outside budget", "size_bytes": MB,
                                               "last_verified_utc": "2026-11-03T00:00:00+00:00",
                                               "part": plan["units"]["ckpt_000250.pt"]["part"]}
    assert sum(p["verify"] for p in plan["parts"].values()) == 2

    # the next audit without a budget reads every byte again and catches the rot outside the budget
    p = run_cli(*audit)
    assert p.returncode == 1, p.stdout + p.stderr
    v = verdict(out)
    assert {"checksum_mismatch", "digest_changed_unseen"} <= set(errors(v, "ckpt_000250.pt"))
    assert "checksum_mismatch" in errors(v, "ckpt_000100.pt")
    assert v["rollback"] == {"unit": "ckpt_000200.pt", "step": 200}
    assert all(u["reverified"] and u["verification_note"] == "" for u in v["units"])
    assert hash_bytes_read(out) >= sum(sizes.values())


def test_a_bad_budget_on_the_command_line_is_a_usage_error(demo_run, tmp_path):
    p = run_cli("audit", str(demo_run.run_dir), "--out", str(tmp_path / "o"), "--verify-budget", "2 furlongs")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "--verify-budget" in p.stderr and "expected bytes (e.g. 2TiB, 500GB)" in p.stderr
