"""The end of every audit in the terminal: the verdict's summary (ckptaudit/outputs/summary.py), each failed job's own
error line (ckptaudit/outputs/job_errors.py), and the progress line (cli/ticker.py)."""

from __future__ import annotations

import io
import subprocess
import sys

from ckptaudit.outputs import job_errors, summary
from ckptaudit.stages import progress
from ckptaudit.cli.ticker import Meter, progress_line

from .conftest import REPO


def _u(name, step, use="resume", findings=()):
    return {"unit": name, "step": step, "usable_for": use, "findings": list(findings)}


def _f(kind, severity, caps, message, path=""):
    return {"kind": kind, "severity": severity, "caps": caps, "message": message, "path": path}


VERDICT = {
    "recommendation": "resume", "rollback": {"unit": "ckpt_000500.pt", "step": 500}, "steps_lost": 100,
    "reasons": ["Resume from ckpt_000500.pt (step 500), losing 100 steps."],
    "units": [_u(f"ckpt_{s:06d}.pt", s) for s in (100, 200, 300, 400)] + [
        _u("ckpt_000450.pt", 450, "none", [_f("checksum_mismatch", "error", "none",
                                              "ckpt_000450.pt: SHA-256 is " + "ab" * 32 + " but its sidecar records "
                                              + "cd" * 32 + ": the bytes changed after they were written.",
                                              "ckpt_000450.pt"),
                                           _f("zip_crc_mismatch", "error", "none", "member fails its CRC")]),
        _u("ckpt_000500.pt", 500),
        _u("ckpt_000600.pt", 600, "none", [_f("truncated_zip_no_central_directory", "error", "none",
                                              "ckpt_000600.pt is a torch.save zip cut short: it is 5 bytes. More.",
                                              "ckpt_000600.pt")]),
        _u("last.ckpt", None, "warm-start", [_f("missing_optimizer_state", "warning", "warm-start",
                                                "last.ckpt has no optimizer state. Resume restarts the moments.")]),
    ],
    "pointer_findings": [],
}


def test_summary_collapses_healthy_runs_and_says_each_damaged_unit():
    assert summary.summary(VERDICT, "/out").splitlines() == [
        "ckptaudit: RESUME from ckpt_000500.pt (step 500), 100 steps lost",
        "  ckpt_000100.pt .. ckpt_000400.pt: 4 units intact",
        "  ckpt_000450.pt (step 450): not usable: member fails its CRC (+1 more)",  # the record, not the digest
        "  ckpt_000500.pt (step 500): intact",
        "  ckpt_000600.pt (step 600): not usable: ckpt_000600.pt is a torch.save zip cut short",
        "  last.ckpt (no step): warm-start only: last.ckpt has no optimizer state",
        "report: /out/report.html",
    ]


def test_summary_of_a_retrain_says_why_and_has_no_rollback():
    v = {"recommendation": "retrain", "rollback": None, "steps_lost": None,
         "reasons": ["Retrain: no checkpoint of this run has usable weights."],
         "units": [_u("a.pt", 1, "none", [_f("empty_file", "error", "none", "a.pt is 0 bytes: the save died.")])]}
    assert summary.summary(v, "/o").splitlines() == [
        "ckptaudit: RETRAIN", "  Retrain: no checkpoint of this run has usable weights.",
        "  a.pt (step 1): not usable: a.pt is 0 bytes: the save died", "report: /o/report.html"]


def test_last_error_line_is_the_exception_of_the_last_traceback():
    log = ("starting\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    f()\n"
           "FileNotFoundError: [Errno 2] No such file or directory: '/run/ckpt.pt'\n\n")
    assert job_errors.last_error_line(log) == "FileNotFoundError: [Errno 2] No such file or directory: '/run/ckpt.pt'"
    assert job_errors.last_error_line("a\nckptaudit: error: /r: the folder is empty\n") == \
        "ckptaudit: error: /r: the folder is empty"
    assert job_errors.last_error_line("\n\n") == ""


class _Rule:
    name = "hash"


class _Job:
    rule = _Rule()

    def __init__(self, log):
        self.wildcards = {"part": "p0003"}
        self.log = [log]


def test_on_error_writes_and_prints_each_failed_jobs_line(tmp_path, monkeypatch, capsys):
    log = tmp_path / "logs" / "hash" / "p0003.log"
    log.parent.mkdir(parents=True)
    log.write_text("Traceback (most recent call last):\n  ...\nOSError: [Errno 5] Input/output error\n")
    wf = type("W", (), {"scheduler": type("S", (), {"failed": {_Job(str(log))}})()})()
    monkeypatch.delenv(job_errors.CLI_ENV, raising=False)
    lines = job_errors.on_error(wf, str(tmp_path))
    assert lines == [f"hash p0003: OSError: [Errno 5] Input/output error (log: {log})"]
    assert capsys.readouterr().err == f"ckptaudit: the audit failed:\n  {lines[0]}\n"
    assert job_errors.read_failed(tmp_path) == lines
    monkeypatch.setenv(job_errors.CLI_ENV, "1")  # ckptaudit prints it itself
    job_errors.on_error(wf, str(tmp_path))
    assert capsys.readouterr().err == ""


def test_meter_says_bytes_of_the_inventory_total_with_rate(tmp_path):
    (tmp_path / "inventory.json").write_text('{"units": [{"size_bytes": 3145728}, {"size_bytes": 1048576}]}')
    clock = [10.0]
    m = Meter(tmp_path / "progress", tmp_path / "inventory.json", clock=lambda: clock[0])
    assert m.text() == ""  # nothing hashed yet: nothing drawn
    w = progress.ProgressWriter(tmp_path / "progress" / "a.progress", 3145728)
    w.add(1048576)
    w.close()
    assert m.text() == "hashed 1.0 MiB of 4.0 MiB (25%)"
    clock[0] += 2.0
    w.add(1048576)
    w.close()
    assert m.text() == "hashed 2.0 MiB of 4.0 MiB (50%), 512.0 KiB/s, ETA 4 s"  # 1 MiB in the 2 s watched
    w2 = progress.ProgressWriter(tmp_path / "progress" / "b.progress", 1048576)
    w2.close()  # every unit has its file now: their own totals (3 MiB + 1 MiB)
    w.add(1048576)
    w.close()
    assert m.text() == "hashed 3.0 MiB of 4.0 MiB (75%), 1.0 MiB/s, ETA 1 s"


def test_progress_line_is_quiet_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    (tmp_path / "work" / "progress").mkdir(parents=True)
    (tmp_path / "work" / "progress" / "old.progress").write_text("5 5\n")
    err = io.StringIO()  # isatty() is False
    with progress_line(tmp_path, stream=err):
        import os

        assert os.environ[progress.ENV] == str(tmp_path / "work" / "progress")
        assert list((tmp_path / "work" / "progress").iterdir()) == []  # the last run's counts are gone
        progress.for_unit({"unit": "u", "size_bytes": 9}).close()
    assert err.getvalue() == ""
    assert progress.ENV not in os.environ


def test_snakemake_audit_on_the_demo_prints_the_summary(tmp_path):
    """``snakemake --cores 2 audit`` (the README's main command, here in a scratch working folder) ends with
    the summary, printed by the Snakefile's onsuccess handler, and exits 1 as ``ckptaudit audit`` does (roll back
    needed and possible; it exited 0, issue 43)."""
    cfg = tmp_path / "small.yaml"
    cfg.write_text("demo:\n  max_steps: 300\n  save_every: 50\n")  # the demo's incident, fewer steps
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
                        "audit", "--cores", "2", "--configfile", str(cfg)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout + p.stderr
    from ckptaudit.workflow.support import report_folder

    report = tmp_path / "reports" / report_folder(str(tmp_path / "demo_run")) / "report.html"
    assert report.parent.name.startswith("demo_run-") and len(report.parent.name) == len("demo_run-") + 8
    expected = [
        "ckptaudit: RESUME from ckpt_000250.pt (step 250), 50 steps lost",
        f"  run folder {tmp_path / 'demo_run'} (unit names below are relative to it)",  # absolute, not 'demo_run'
        "  ckpt_000050.pt .. ckpt_000100.pt: 2 units intact",
        "  ckpt_000200.pt .. ckpt_000250.pt: 2 units intact",
        "  ckpt_000300.pt (step 300): not usable: ckpt_000300.pt is a torch.save zip cut short",
        f"report: {report}",
    ]
    lines = out.splitlines()
    for e in expected:
        assert e in lines, out[-3000:]
    assert any(ln.startswith("  ckpt_000150.pt (step 150): not usable: member archive/data/10 fails its CRC32 check")
               for ln in lines), out[-3000:]
    assert lines.index(expected[0]) < lines.index(f"report: {report}")
    assert report.exists()


def test_of_a_failed_group_job_only_the_members_that_erred_are_named(tmp_path):
    ok, bad = tmp_path / "ok.log", tmp_path / "bad.log"
    ok.write_text("wrote 3 rows\n")
    bad.write_text("Traceback (most recent call last):\n  ...\nValueError: part p0001 has no unit\n")
    group = type("G", (), {"jobs": [_Job(str(ok)), _Job(str(bad))]})()
    assert job_errors.job_lines([group]) == [f"hash p0003: ValueError: part p0001 has no unit (log: {bad})"]
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert job_errors.job_lines([_Job(str(empty))]) == [f"hash p0003: failed; its log {empty} is empty"]


def test_long_lines_are_cut_at_a_word_and_end_with_an_ellipsis():
    """The user's Lightning run: the pointer line was cut inside "truncated_zip_no_central_di", with no "…"."""
    msg = ("checkpoints/last.ckpt names 'last.ckpt', which exists but is not usable "
           "(truncated_zip_no_central_directory); the newest usable checkpoint is checkpoints/epoch=0-step=20.ckpt")
    v = {**VERDICT, "pointer_findings": [{"severity": "error", "kind": "latest_pointer_target_unusable",
                                          "path": "checkpoints/last.ckpt", "message": msg}]}
    line = summary.unit_lines(v)[-1]
    assert line == ("  pointer checkpoints/last.ckpt: checkpoints/last.ckpt names 'last.ckpt', which exists but is "
                    "not usable…")
    long_unit = _u("u.pt", 7, "none", [_f("x", "error", "none", "u.pt: " + "word " * 40 + "end")])
    what = summary.unit_lines({"units": [long_unit]})[0]
    assert what.endswith("word…") and len(what.split(": ", 2)[2]) <= summary.WHAT_CHARS


def test_drill_summary_line_is_cut_at_a_word_boundary():
    from ckptaudit.drill.outputs import summary_line

    message = ("the restore hook could not be used: set drill.hook to your job's restore function "
               "(\"package.module:function\", see docs/drill.md): 'ckptaudit.demo:restore_hook' cannot restore it")
    rows = [{"check": "restore_hook", "device": "cpu", "status": "fail", "message": message}]
    line = summary_line({"exit_code": 3, "unit": "checkpoint-20", "step": 20}, rows)
    assert line == ("ckptaudit drill: DRILL FAILED checkpoint-20 (step 20): restore_hook@cpu: the restore hook "
                    "could not be used: set drill.hook to your job's restore function (\"package.module:function\", "
                    "see docs/drill.md)…")


def test_the_rollback_units_line_says_what_to_act_on_and_counts_severities_as_they_are():
    """A repair the resume needs is on the rollback unit's line, not '1 warning (see the report)'; an error
    is counted as an error; a shell repair says the folder it runs in, a code repair says where it goes."""
    sched = dict(_f("missing_scheduler_state", "warning", "resume", "ckpt_000500.pt has no LR-scheduler state."),
                 repair="for _ in range(500): scheduler.step()")
    entry = dict(_f("resume_entry_damaged", "error", "resume", "last.ckpt is damaged."),
                 repair="cp -p ckpt_000500.pt last.ckpt.tmp && mv last.ckpt.tmp last.ckpt")
    v = dict(VERDICT, run_dir="/runs/a", units=[_u("ckpt_000400.pt", 400, "resume", [
        _f("norm_jump", "error", "resume", "x"), _f("w", "warning", "resume", "y")]),
        _u("ckpt_000500.pt", 500, "resume", [sched, entry])])
    lines = summary.summary(v, "/out").splitlines()
    assert lines[1] == "  run folder /runs/a (unit names below are relative to it)"
    assert "  ckpt_000400.pt (step 400): usable for resume, 1 error, 1 warning (see the report)" in lines
    i = lines.index("  ckpt_000500.pt (step 500): the rollback point, usable for resume, 1 error, 1 warning; "
                    "before resuming from it:")
    assert lines[i + 1] == ("    warning: ckpt_000500.pt has no LR-scheduler state. Repair (in the resume script): "
                            "for _ in range(500): scheduler.step()")
    assert lines[i + 2] == ("    error: last.ckpt is damaged. Repair (run in /runs/a): cp -p ckpt_000500.pt "
                            "last.ckpt.tmp && mv last.ckpt.tmp last.ckpt")
    assert summary.severity_counts([_f("a", "error", "", ""), _f("b", "info", "", "")]) == "1 error"


def test_a_damaged_units_line_is_never_cut_inside_parentheses():
    """A sealed HF copy's chunk_checksum_mismatch printed "bytes 0 to 122919 (122920 bytes (+2 more)": the
    clause was cut at the ": " inside the parentheses."""
    msg = ("model.safetensors: bytes 0 to 122919 (122920 bytes: chunk(s) 0 of 1, 122920 bytes each) do not match "
           "the BLAKE3 chunk digest(s) recorded in the manifest; tensor x. More.")
    v = {"recommendation": "resume", "rollback": {"unit": "checkpoint-20", "step": 20}, "steps_lost": 10,
         "units": [_u("checkpoint-20", 20), _u("checkpoint-30", 30, "none", [
             _f("chunk_checksum_mismatch", "error", "none", msg, "checkpoint-30/model.safetensors")])]}
    line = summary.summary(v, "/o").splitlines()[-2]
    assert line == ("  checkpoint-30 (step 30): not usable: model.safetensors: bytes 0 to 122919 (122920 bytes: "
                    "chunk(s) 0 of 1, 122920 bytes each) do not…"), line


def _flip_in_member(path, member_suffix, find=b""):
    """Flip one bit inside the stored bytes of the zip record whose name ends with ``member_suffix`` (at the
    first occurrence of ``find`` in it, else 1000 bytes in), leaving every header and the central directory."""
    import struct
    import zipfile

    info = next(i for i in zipfile.ZipFile(path).infolist() if i.filename.endswith(member_suffix))
    b = bytearray(path.read_bytes())
    n, e = struct.unpack("<HH", b[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + n + e
    at = bytes(b[start:start + info.file_size]).index(find) if find else 1000
    b[start + at] ^= 1
    path.write_bytes(bytes(b))


def test_a_complete_file_with_a_damaged_tensor_shows_the_step_its_data_pkl_records(tmp_path):
    """A one-bit flip in a tensor record of a complete ``ckpt.pt`` left the summary saying ``ckpt.pt (no step)``
    although data.pkl, which holds ``step`` at its root, passed its own CRC: the state stage read no counter from
    a unit whose weights were damaged.  A flip inside data.pkl itself still shows no step (its bytes are not the
    saved ones)."""
    import torch

    from ckptaudit.pipeline import audit_in_process

    run = tmp_path / "run"
    run.mkdir()
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 200)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 300)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 40, "note": "x" * 64},
               run / "ckpt.pt")
    clean = (run / "ckpt.pt").read_bytes()
    _flip_in_member(run / "ckpt.pt", "/data/0")  # model.weight's record
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    (u,) = v["units"]
    assert (u["unit"], u["step"], u["usable_for"]) == ("ckpt.pt", 40, "none")
    assert [f["kind"] for f in u["findings"] if f["severity"] == "error"] == ["zip_crc_mismatch"]
    line = summary.summary(v, "/o").splitlines()[-2]
    assert line.startswith("  ckpt.pt (step 40): not usable: member ckpt/data/0 fails its CRC32 check"), line

    (run / "ckpt.pt").write_bytes(clean)
    _flip_in_member(run / "ckpt.pt", "data.pkl", find=b"xxxx")
    v = audit_in_process(run, {}, out_dir=tmp_path / "out2")
    (u,) = v["units"]
    assert u["step"] is None and "ckpt.pt (no step): not usable: member ckpt/data.pkl fails its CRC32" in \
        summary.summary(v, "/o")
