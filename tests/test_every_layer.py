"""A security refusal decides a unit's usability; it never hides the unit's other layers (issue 42).

A unit refused for a pickle that would run code got no state or structure judgement (the state, structure and
configdiff stages skipped it), so a postmortem reader saw one reason where there were several, and a fix of the
pickle alone would have led straight into NaN weights or a cut file.  Each file here is written by
``torch.save`` with a payload as public advisories describe it (a ``__reduce__`` returning ``os.system``); the
audit never unpickles it (the payload's file never appears).
"""

from __future__ import annotations

import os

import pytest

from ckptaudit.pipeline import audit_in_process

from .conftest import PAYLOAD


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {PAYLOAD}",))


def _kinds(v: dict, unit: str) -> dict:
    u = next(u for u in v["units"] if u["unit"] == unit)
    return {f["kind"]: f["layer"] for f in u["findings"] if f["severity"] != "info"}, u["usable_for"]


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_refused_unit_keeps_its_file_and_state_findings(tmp_path, legacy):
    import torch

    run = tmp_path / "run"
    run.mkdir()
    w = torch.randn(64, 64)
    w[3, 3] = float("nan")
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.randn(64, 64))])
    torch.save({"model": {"w": w}, "optimizer": opt.state_dict(), "step": 100, "cfg": _Payload()},
               run / "ckpt_000100.pt", _use_new_zipfile_serialization=not legacy)
    p = run / "ckpt_000100.pt"
    if not legacy:  # an intact copy: its state layer still speaks
        (run / "ckpt_000050.pt").write_bytes(p.read_bytes())
    if legacy:  # cut inside the storage bytes
        os.truncate(p, p.stat().st_size - 5000)
    else:  # one byte of the weight's record flipped: its CRC-32 fails
        import zipfile

        info = next(i for i in zipfile.ZipFile(p).infolist() if i.filename.endswith("/data/0"))
        with open(p, "r+b") as fh:
            fh.seek(info.header_offset + 200)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 0xFF]))

    v = audit_in_process(run, {}, out_dir=tmp_path / "out")

    kinds, usable = _kinds(v, "ckpt_000100.pt")
    assert usable == "none"
    assert kinds.get("malicious_pickle_code_exec") == "security"
    assert kinds.get("truncated_legacy_pickle" if legacy else "zip_crc_mismatch") == "file", kinds
    if not legacy:  # the walk of an intact data.pkl still gives the state layer its tree and values
        kinds, usable = _kinds(v, "ckpt_000050.pt")
        assert usable == "none" and kinds.get("malicious_pickle_code_exec") == "security"
        assert kinds.get("nan_in_weights") == kinds.get("empty_optimizer_state") == "state", kinds
    assert not list(tmp_path.rglob(PAYLOAD)) and not list(run.rglob(PAYLOAD))
