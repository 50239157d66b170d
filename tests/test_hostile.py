"""Hostile paths in a run folder never hang, flood memory or end the audit: each is a named finding.

Regression: a FIFO named like a checkpoint (as a unit, inside a folder unit, or as a sidecar) blocked
forever; a symlink to /dev/zero inside a folder unit was hashed forever; a checkpoint-named symlink to
/etc/passwd was an OK pointer; a folder named ckpt_000300.pt got no finding; a non-UTF-8 name ended the
audit; a 3 GiB sparse index was read whole; an 8-byte data.pkl (a list appended to itself) or a DAG of
shared lists made the tree description grow without bound (killed at 240 s and 3 GiB).
"""

import os
import shutil
import time

import pytest
import torch

from ckptaudit.pipeline import audit_in_process


def _good(d, steps=(100, 200)):
    d.mkdir(parents=True, exist_ok=True)
    m = torch.nn.Linear(3, 2)
    o = torch.optim.AdamW(m.parameters())
    for s in steps:
        m(torch.randn(1, 3)).sum().backward()
        o.step()
        torch.save({"model": m.state_dict(), "optimizer": o.state_dict(), "step": s, "rng": torch.get_rng_state()},
                   d / f"ckpt_{s:06d}.pt")
    return d


def _trainer_folder(d, optimizer_maker):
    f = d / "checkpoint-300"
    f.mkdir()
    shutil.copy(d / "ckpt_000200.pt", f / "pytorch_model.bin")
    (f / "trainer_state.json").write_text('{"global_step": 300}')
    optimizer_maker(f / "optimizer.pt")


def _make(kind, d):
    _good(d)
    if kind == "fifo_unit":
        os.mkfifo(d / "ckpt_000300.pt")
    elif kind == "fifo_in_folder":
        _trainer_folder(d, os.mkfifo)
    elif kind == "devzero_in_folder":
        _trainer_folder(d, lambda p: os.symlink("/dev/zero", p))
    elif kind == "symlink_outside":
        os.symlink("/etc/passwd", d / "ckpt_000300.pt")
    elif kind == "folder_named_pt":
        (d / "ckpt_000300.pt").mkdir()
    elif kind == "non_utf8_name":
        shutil.copy(d / "ckpt_000200.pt", os.path.join(os.fsencode(d), b"ckpt_000300\xff.pt"))
    elif kind == "fifo_sidecar":
        os.mkfifo(d / "ckpt_000200.pt.sha256")
    elif kind in ("self_appended_list", "shared_list_dag"):
        import zipfile

        if kind == "self_appended_list":  # 8 bytes of opcodes: a list appended to itself twice
            pk = b"\x80\x02]q\x00h\x00ah\x00a."
        else:  # L_{i+1} = [L_i, L_i], 35 levels: no cycle, 2**35 paths through shared lists
            pk = b"\x80\x02]q\x00" + b"".join(b"](h" + bytes([i]) + b"h" + bytes([i]) + b"eq" + bytes([i + 1])
                                              for i in range(35)) + b"."
        with zipfile.ZipFile(d / "ckpt_000300.pt", "w") as z:
            z.writestr("archive/data.pkl", pk)
            z.writestr("archive/byteorder", "little")
            z.writestr("archive/version", "3\n")
    elif kind == "sparse_index":
        with open(d / "model.safetensors.index.json", "wb") as f:
            f.truncate(3 << 30)


# kind -> (unit or pointer carrying the finding, finding kind); None: no error is expected
EXPECT = {
    "fifo_unit": ("ckpt_000300.pt", "not_a_regular_file"),
    "fifo_in_folder": ("checkpoint-300", "not_a_regular_file"),
    "devzero_in_folder": ("checkpoint-300", "not_a_regular_file"),
    "symlink_outside": ("ckpt_000300.pt", "pointer_refused"),
    "folder_named_pt": ("ckpt_000300.pt", "not_a_regular_file"),
    "non_utf8_name": ("ckpt_000300\\xff.pt", "not_a_regular_file"),
    "fifo_sidecar": ("ckpt_000200.pt", "sidecar_unreadable"),
    "sparse_index": ("model.safetensors.index.json", "index_invalid"),
    "self_appended_list": ("ckpt_000300.pt", "missing_model_weights"),
    "shared_list_dag": ("ckpt_000300.pt", "pickle_too_complex"),
}


@pytest.mark.parametrize("kind", sorted(EXPECT))
def test_hostile_path_is_a_finding(kind, tmp_path):
    run = tmp_path / "run"
    _make(kind, run)
    t0 = time.monotonic()
    v = audit_in_process(run, out_dir=tmp_path / "out")
    assert time.monotonic() - t0 < 60
    where, finding = EXPECT[kind]
    units = {u["unit"]: u for u in v["units"]}
    kinds = {f["kind"] for f in units.get(where, {}).get("findings", [])} | {
        p["kind"] for p in v["pointers"] if p["path"] == where}
    assert finding in kinds, (kinds, sorted(units))
    assert v["recommendation"] == "resume" and v["rollback"]["unit"] == "ckpt_000200.pt"
