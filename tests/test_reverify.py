"""ckptaudit.verification.reverify: the audit id, the stat key --reuse trusts, and which units an audit re-verified."""

import os
import time

from ckptaudit.verification import reverify


def test_stat_key_sees_a_write_whose_size_and_mtime_were_put_back(tmp_path):
    p = tmp_path / "ckpt.pt"
    p.write_bytes(b"\0" * 4096)
    before = reverify.stat_key(str(p))
    st = p.stat()
    time.sleep(0.05)  # ctime ticks with the kernel's coarse clock (milliseconds); a nightly re-run is hours later
    with open(p, "r+b") as f:
        f.seek(2048)
        f.write(b"\1")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = reverify.stat_key(str(p))
    assert after[:2] == before[:2]  # size and mtime: what the old re-run signature compared
    assert after[2] > before[2]  # ctime: the kernel sets it on the write and on utime itself
    assert reverify.stat_key(str(tmp_path / "missing")) is None


def test_audit_id_is_new_in_the_main_process_and_inherited_by_jobs(monkeypatch):
    monkeypatch.delenv(reverify.ENV, raising=False)
    a = reverify.audit_id(main_process=True)
    assert os.environ[reverify.ENV] == a and a.endswith(f"/{os.getpid()}")
    assert reverify.audit_id(main_process=False) == a
    assert reverify.audit_id(main_process=True) != a


def test_summary_counts_units_hashed_since_the_audit_started():
    rows = [{"unit": "a", "hashed_at_utc": "2026-12-02T10:00:00.000000+00:00"},
            {"unit": "a", "hashed_at_utc": "2026-12-01T10:00:00.000000+00:00"},  # a's oldest file: reused
            {"unit": "b", "hashed_at_utc": "2026-12-02T10:00:01.000000+00:00"},
            {"unit": "c", "hashed_at_utc": None}]  # never hashed (missing file)
    s = reverify.summary(rows, "2026-12-02T09:59:59.000000+00:00/42", reuse=True)
    assert s == {"audit_started_utc": "2026-12-02T09:59:59.000000+00:00", "reuse": True, "units_reverified": 1,
                 "units_reused": 1, "last_hashed_utc": {"a": "2026-12-01T10:00:00.000000+00:00",
                                                        "b": "2026-12-02T10:00:01.000000+00:00"}}
