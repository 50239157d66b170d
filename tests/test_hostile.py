"""The adversarial set: every hostile run folder gets a verdict and a named finding in ≤ 60 s and ≤ 1 GiB.

One case each of the bombs, FIFOs, device symlinks, sparse giants, deep recursion, huge shapes,
non-UTF-8 names and unreadable files (vanishing files are in ``test_liveness.py`` and
``test_live_run.py``).  Each run holds two good units (steps 100 and 200) beside the hostile one,
so the verdict must still be "resume from ckpt_000200.pt" (or step-6 for the DCP runs).  Each audit
runs in a fresh child process whose own peak RSS and its load-test children's are measured, and whose
process tree's memory (PSS, summed over the child and every process below it) is sampled while it runs.

Regressions: a FIFO named like a checkpoint (as a unit, inside a folder unit, or as a sidecar)
blocked forever; a symlink to /dev/zero inside a folder unit was hashed forever; a checkpoint-named
symlink to /etc/passwd was an OK pointer; a folder named ckpt_000300.pt got no finding; a non-UTF-8
name ended the audit; a 3 GiB sparse index and a 4 GiB sparse DCP ``.metadata`` were read whole; an
8-byte data.pkl (a list appended to itself) or a DAG of shared lists made the tree description
grow without bound (killed at 240 s and 3 GiB); a DAG of shared dicts (d1 = {'a': d0, 'b': d0}, …)
was described up to the million-node budget and read again by every stage (past 1 GiB over the
process tree in 12 s); a FIFO as a shard of an HF index at the run's top (or as the index) blocked
the hash job forever; a 20-million-opcode data.pkl took 1.5 GiB and
58 s; safetensors offsets of 2**63 or a (2**40, 2**40) shape raised OverflowError writing Parquet;
DCP ``offset="x"``, a 100,000-deep persistent id, deep JSON in trainer_state.json or an index, and a
DCP value blob whose zip claims "version needed 7.0" ended the audit (exit 3).
"""

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch

SHARED_DCP = Path(__file__).resolve().parents[2] / "shared" / "cases" / "ok_dcp" / "step-6"
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
# a root process reads mode-000 files (CAP_DAC_OVERRIDE): drop those capabilities for that case
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
          "--inh-caps=-dac_override,-dac_read_search"] if AS_ROOT else []

_CHILD = r"""
import json, resource, sys, time
from ckptaudit.pipeline import audit_in_process
t0 = time.monotonic()
v = audit_in_process(sys.argv[1], out_dir=sys.argv[2])
def peak_mib():  # VmHWM starts afresh at exec; ru_maxrss keeps the parent's peak across exec on Linux
    try:
        line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({
    "seconds": time.monotonic() - t0,
    "rss_mib": peak_mib(),
    "children_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "recommendation": v["recommendation"],
    "rollback": (v.get("rollback") or {}).get("unit"),
    "kinds": {u["unit"]: sorted({f["kind"] for f in u["findings"]}) for u in v["units"]},
    "paths": {u["unit"]: sorted({f["path"] or "" for f in u["findings"]}) for u in v["units"]},
    "pointers": {p["path"]: sorted({f["kind"] for f in p.get("findings", [])} | {p.get("kind") or ""})
                 for p in v["pointers"]},
}))
"""


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


def _trainer_folder(d, optimizer_maker=None, trainer_state='{"global_step": 300}'):
    f = d / "checkpoint-300"
    f.mkdir()
    shutil.copy(d / "ckpt_000200.pt", f / "pytorch_model.bin")
    (f / "trainer_state.json").write_text(trainer_state)
    if optimizer_maker:
        optimizer_maker(f / "optimizer.pt")
    return f


def _zip_pickle(path, pk, deflate=False):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pk)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")


def _safetensors(path, header, data=b"\0" * 8):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def _hf_index(d, make_second_shard, index_maker=None):
    """An HF sharded index at the run's top (a unit of its own, no Trainer folder around it) whose second
    shard ``make_second_shard(path)`` makes; ``index_maker(path)`` makes the index itself instead of writing it."""
    from safetensors.torch import save_file

    save_file({"a": torch.ones(3)}, d / "model-00001-of-00002.safetensors")
    make_second_shard(d / "model-00002-of-00002.safetensors")
    index = d / "model.safetensors.index.json"
    if index_maker:
        index_maker(index)
    else:
        index.write_text(json.dumps({"metadata": {"total_size": 24}, "weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))


def _shared_dict_dag(levels=40):
    """data.pkl of d0 = {}; d_{i+1} = {'a': d_i, 'b': d_i}, each dict memoised (BINPUT) and fetched (BINGET)
    as pickle itself writes shared objects: a few hundred bytes, 2**levels paths when rebuilt."""
    key = lambda c: b"X\x01\x00\x00\x00" + c  # noqa: E731 - BINUNICODE of one character
    return b"\x80\x02}q\x00" + b"".join(b"}(" + key(b"a") + b"h" + bytes([i]) + key(b"b") + b"h" + bytes([i])
                                       + b"uq" + bytes([i + 1]) for i in range(levels)) + b"."


def _dcp_run(d):
    d.mkdir(parents=True)
    shutil.copytree(SHARED_DCP, d / "step-6")
    shutil.copytree(SHARED_DCP, d / "step-12")
    return d / "step-12" / ".metadata"


def _forge_zip_version(blob: bytearray) -> None:
    """Set "version needed to extract" to 7.0 in every local header and central directory record."""
    for sig, off in ((b"PK\x03\x04", 4), (b"PK\x01\x02", 6)):
        i = blob.find(sig)
        while i >= 0:
            blob[i + off: i + off + 2] = (70).to_bytes(2, "little")
            i = blob.find(sig, i + 4)


def _make(kind, d):  # noqa: C901 - one branch per case, kept together so each case reads in one place
    if kind.startswith("dcp_"):
        md = _dcp_run(d)
        if kind == "dcp_offset_x":  # the test writes this .metadata itself: unpickling our own file is safe
            m = pickle.loads(md.read_bytes())
            object.__setattr__(m.storage_data[next(iter(m.storage_data))], "offset", "x")
            md.write_bytes(pickle.dumps(m))
        elif kind == "dcp_deep_persistent_id":
            md.write_bytes(b"\x80\x02" + b"(" * 100_000 + b"t" * 100_000 + b"Q.")
        elif kind == "dcp_computed_class":  # object()()()... 100,000 calls deep, then NEWOBJ of the result
            md.write_bytes(b"\x80\x02cbuiltins\nobject\n" + b")R" * 100_000 + b")\x81.")
        elif kind == "dcp_sparse_metadata":
            with open(md, "wb") as f:
                f.truncate(4 << 30)
        elif kind == "dcp_zip_version_7":
            m = pickle.loads(md.read_bytes())
            info = next(v for k, v in m.storage_data.items() if k.fqn == "step")
            p = md.parent / info.relative_path
            b = bytearray(p.read_bytes())
            blob = b[info.offset: info.offset + info.length]
            _forge_zip_version(blob)
            b[info.offset: info.offset + info.length] = blob
            p.write_bytes(bytes(b))
        return
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
    elif kind == "fifo_index_shard":  # the index is read; the FIFO it names as a shard must never be opened
        _hf_index(d, os.mkfifo)
    elif kind == "fifo_index":
        _hf_index(d, lambda p: shutil.copy(d / "model-00001-of-00002.safetensors", p), os.mkfifo)
    elif kind == "self_appended_list":  # 8 bytes of opcodes: a list appended to itself twice
        _zip_pickle(d / "ckpt_000300.pt", b"\x80\x02]q\x00h\x00ah\x00a.")
    elif kind == "shared_list_dag":  # L_{i+1} = [L_i, L_i], 35 levels: no cycle, 2**35 paths
        _zip_pickle(d / "ckpt_000300.pt", b"\x80\x02]q\x00" + b"".join(
            b"](h" + bytes([i]) + b"h" + bytes([i]) + b"eq" + bytes([i + 1]) for i in range(35)) + b".")
    elif kind == "shared_dict_dag":  # the same DAG as shared_list_dag, of dicts: 2**40 paths
        _zip_pickle(d / "ckpt_000300.pt", _shared_dict_dag(40))
    elif kind == "twenty_million_opcodes":  # 40 MB of BININT1 in one list, ~60 KB deflated
        _zip_pickle(d / "ckpt_000300.pt", b"\x80\x02](" + b"K\x01" * 20_000_000 + b"e.", deflate=True)
    elif kind == "ten_million_memoised_lists":
        _zip_pickle(d / "ckpt_000300.pt", b"\x80\x04](" + b"]\x94" * 10_000_000 + b"e.", deflate=True)
    elif kind == "payload_behind_padding":  # os.system after 10 M opcodes of padding: still named
        _zip_pickle(d / "ckpt_000300.pt", b"\x80\x04](" + b"K\x01" * 10_000_000 + b"e0"
                    + b"\x8c\x02os\x94\x8c\x06system\x94\x93\x8c\x04true\x85R.", deflate=True)
    elif kind == "deep_persistent_id":
        _zip_pickle(d / "ckpt_000300.pt", b"\x80\x02" + b"(" * 100_000 + b"t" * 100_000 + b"Q.")
    elif kind == "deep_nested_tuple":
        _zip_pickle(d / "ckpt_000300.pt", b"\x80\x02" + b")\x85" * 100_000 + b".")
    elif kind == "sparse_index":
        with open(d / "model.safetensors.index.json", "wb") as f:
            f.truncate(3 << 30)
    elif kind == "deep_json_index":
        (d / "model.safetensors.index.json").write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif kind == "deep_json_trainer_state":
        _trainer_folder(d, trainer_state="[" * 100_000 + "]" * 100_000)
    elif kind == "safetensors_offset_2_63":
        _safetensors(d / "model.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [2**63, 2**63 + 8]}})
    elif kind == "safetensors_shape_2_40_squared":
        _safetensors(d / "model.safetensors", {"w": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 8]}})
    elif kind == "unreadable_file":
        shutil.copy(d / "ckpt_000200.pt", d / "ckpt_000300.pt")
        os.chmod(d / "ckpt_000300.pt", 0)
    elif kind == "unreadable_file_in_folder":
        f = _trainer_folder(d)
        os.chmod(f / "trainer_state.json", 0)
    elif kind == "unreadable_folder":
        os.chmod(_trainer_folder(d), 0)
    elif kind == "one_gib_last_ckpt":  # a real 1 GiB Lightning-style file: sniffed by prefix, never read whole
        torch.save({"state_dict": {"w": torch.zeros(256 << 20)}, "global_step": 300, "epoch": 0}, d / "last.ckpt")
    else:  # pragma: no cover
        raise KeyError(kind)


# kind -> (unit or pointer carrying the finding, finding kind); unreadable_*: run without DAC override
EXPECT = {
    "fifo_index_shard": ("model.safetensors.index.json", "not_a_regular_file"),
    "fifo_index": ("model.safetensors.index.json", "not_a_regular_file"),
    "shared_dict_dag": ("ckpt_000300.pt", "pickle_too_complex"),
    "fifo_unit": ("ckpt_000300.pt", "not_a_regular_file"),
    "fifo_in_folder": ("checkpoint-300", "not_a_regular_file"),
    "devzero_in_folder": ("checkpoint-300", "path_outside_run"),  # a link to /dev/zero leaves the run
    "symlink_outside": ("ckpt_000300.pt", "path_outside_run"),
    "folder_named_pt": ("ckpt_000300.pt", "not_a_regular_file"),
    "non_utf8_name": ("ckpt_000300\\xff.pt", "not_a_regular_file"),
    "fifo_sidecar": ("ckpt_000200.pt", "sidecar_unreadable"),
    "self_appended_list": ("ckpt_000300.pt", "missing_model_weights"),
    "shared_list_dag": ("ckpt_000300.pt", "pickle_too_complex"),
    "twenty_million_opcodes": ("ckpt_000300.pt", "pickle_too_complex"),
    "ten_million_memoised_lists": ("ckpt_000300.pt", "pickle_too_complex"),
    "payload_behind_padding": ("ckpt_000300.pt", "malicious_pickle_code_exec"),
    "deep_persistent_id": ("ckpt_000300.pt", "missing_model_weights"),
    "deep_nested_tuple": ("ckpt_000300.pt", "missing_model_weights"),
    "sparse_index": ("model.safetensors.index.json", "index_invalid"),
    "deep_json_index": ("model.safetensors.index.json", "index_invalid"),
    "deep_json_trainer_state": ("checkpoint-300", "state_file_unreadable"),
    "safetensors_offset_2_63": ("model.safetensors", "safetensors_offsets_invalid"),
    "safetensors_shape_2_40_squared": ("model.safetensors", "safetensors_offsets_invalid"),
    "unreadable_file": ("ckpt_000300.pt", "file_unreadable"),
    "unreadable_file_in_folder": ("checkpoint-300", "file_unreadable"),
    "unreadable_folder": ("checkpoint-300", "file_unreadable"),
    "one_gib_last_ckpt": ("last.ckpt", "missing_optimizer_state"),
    "dcp_offset_x": ("step-12", "dcp_metadata_unreadable"),
    "dcp_deep_persistent_id": ("step-12", "dcp_metadata_unreadable"),
    "dcp_computed_class": ("step-12", "malicious_pickle_code_exec"),
    "dcp_sparse_metadata": ("step-12", "dcp_metadata_unreadable"),
    # torch reads the forged blob (miniz ignores the field), so the step is read: 6, in a folder named step-12
    "dcp_zip_version_7": ("step-12", "step_name_disagrees"),
}


# kind -> the path its finding must name, where that is not the unit itself (a shard of an index unit)
NAMED = {"fifo_index_shard": "model-00002-of-00002.safetensors"}


def _tree_pss_bytes(pid: int) -> int:
    """Memory of process ``pid`` and every process below it: the sum of their PSS (``smaps_rollup``; pages
    shared by a forked child and its parent counted once between them), RSS where PSS cannot be read."""
    kids = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(e))
            except (OSError, IndexError, ValueError):
                continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, []))
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            try:
                with open(f"/proc/{p}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except OSError:
                pass
    return total


def run_measured(cmd, env, timeout=120, cwd=None):
    """Run ``cmd``; ``(completed process, peak MiB of its process tree, seconds)``, its tree sampled every 0.1 s
    (:func:`_tree_pss_bytes`).  Past ``timeout`` the process is killed and the test fails, naming the command."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_pss_bytes(proc.pid))
            done.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[-3:]} still running after {timeout} s: {err[-2000:]}")
    finally:
        done.set()
        t.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), peak[0] / 2**20, time.monotonic() - t0


def _audit_in_child(run: Path, out: Path, prefix=()):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("CKPTAUDIT_RAISE_AUDIT_ERRORS", None)
    p, tree_mib, _ = run_measured([*prefix, sys.executable, "-c", _CHILD, str(run), str(out)], env)
    assert p.returncode == 0, p.stderr[-3000:]
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "tree_mib": tree_mib}


@pytest.mark.parametrize("kind", sorted(EXPECT))
def test_hostile_run_gets_a_verdict_and_a_named_finding(kind, tmp_path):
    """Guards against one hostile file ending, hanging or swelling the audit so that the good units beside it
    get no verdict (each case: the regression named in this module's docstring)."""
    run = tmp_path / "run"
    _make(kind, run)
    prefix = NO_DAC if kind.startswith("unreadable") else []
    if prefix and not shutil.which(prefix[0]):
        pytest.skip("running as root without setpriv: mode 000 files are readable")
    try:
        r = _audit_in_child(run, tmp_path / "out", prefix)
    finally:
        if prefix or not AS_ROOT:  # let pytest clean up the mode-000 files and folders
            subprocess.run(["chmod", "-R", "u+rwX", str(run)], check=False)
    where, finding = EXPECT[kind]
    kinds = set(r["kinds"].get(where, [])) | set(r["pointers"].get(where, []))
    assert finding in kinds, (kinds, r["kinds"])
    if kind in NAMED:
        assert NAMED[kind] in r["paths"][where], r["paths"]
    assert not any("audit_error" in k for k in r["kinds"].values()), r["kinds"]
    good = "step-6" if kind.startswith("dcp_") else "ckpt_000200.pt"
    assert (r["recommendation"], r["rollback"]) == ("resume", good), r
    assert r["seconds"] <= 60, r
    assert r["rss_mib"] <= 1024 and r["children_rss_mib"] <= 1024 and r["tree_mib"] <= 1024, r


@pytest.mark.parametrize("kind", ["non_utf8_name", "fifo_index_shard", "shared_dict_dag"])
def test_hostile_run_through_the_snakemake_workflow(kind, tmp_path):
    """Guards against the workflow's own code (its input functions, the hash job, every stage re-reading the
    scan tree) ending, hanging or swelling on what ``audit_in_process`` survives: a name that is not UTF-8 was
    exit 3 in an input function, a FIFO shard hung the hash job, a shared-dict DAG passed 1 GiB."""
    run = tmp_path / "run"
    _make(kind, run)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("CKPTAUDIT_RAISE_AUDIT_ERRORS", None)
    p, tree_mib, seconds = run_measured([sys.executable, "-m", "ckptaudit.cli", "audit", str(run), "--out", str(out),
                                         "--cores", "2"], env, timeout=180)
    assert p.returncode in (0, 1), p.stdout + p.stderr[-3000:]
    v = json.loads((out / "verdict.json").read_text())
    where, finding = EXPECT[kind]
    units = {u["unit"]: u for u in v["units"]}
    assert finding in {f["kind"] for f in units[where]["findings"]}, units[where]["findings"]
    if kind in NAMED:
        assert any(f["path"] == NAMED[kind] for f in units[where]["findings"]), units[where]["findings"]
    assert (v["recommendation"], v["rollback"]["unit"]) == ("resume", "ckpt_000200.pt")
    assert units["ckpt_000200.pt"]["usable_for"] == "resume"
    assert seconds <= 60 and tree_mib <= 1024, (seconds, tree_mib)
