"""Issue 13: fuzz acceptance of the whole audit over mutated real checkpoint files.

Seeds are real files written by the real libraries (``torch.save`` zip and legacy,
``safetensors.torch.save_file``, ``torch.distributed.checkpoint.save``, transformers
``save_pretrained(max_shard_size=…)`` and ``TrainerState.save_to_json``), plus copies of
the healthy case folders (``ok_full_torch``, ``ok_safetensors``, ``ok_dcp/step-6``,
``ok_hf_sharded``, a Trainer ``checkpoint-20``, framework fixtures) when they are present.
Each mutated file is its own unit of a run folder: ``ckpt_{i:06d}.pt``,
``model_{i:06d}.safetensors``, ``step-{i}/`` (DCP ``.metadata`` or ``__0_0.distcp``
mutated, the other file a hard link of the seed's) and ``checkpoint-{i}/`` (HF
``model.safetensors.index.json`` or ``trainer_state.json`` mutated, the rest links).
Half of the mutated files keep their seed's ``sha256sum`` sidecar.

Mutations: bit flips; 1/2/4/8-byte overwrites with 0, 0xff…, 2**31, 2**63 and
friends; truncation; zero-filled spans; chunk duplication, deletion, insertion;
splicing two seeds; and format-aware ones — zip local-header, central-directory,
(ZIP64) end-record and data-descriptor fields (sizes, offsets, version needed, name
lengths, names); ``data.pkl`` opcode edits re-zipped the way torch lays records out;
legacy pickles and storage-size prefixes; safetensors header offsets, shapes,
dtypes and header length; JSON numbers made huge/negative/float/strings, paths,
deep nesting, type changes, text damage.

Each run folder (one format, ``--batch`` units) is audited in process
(``ckptaudit.pipeline.audit_in_process``) by one of ``--workers`` worker processes
fed batches over a pipe.  The worker reports the start and end of each unit's
examination in each stage (``ckptaudit.stages.liveness.guard``); the parent kills a worker
(its whole process group) whose unit has been examined for more than ``--timeout``
seconds, records that file as a hang and audits the rest of the batch again.  A
batch whose audit raises, whose worker dies, or whose run-level work (inventory,
report) stalls, is split in halves down to the one file responsible.  Measured:
files per format, uncaught exceptions (``audit_in_process`` raised, or an
``audit_error`` finding), hangs, peak RSS of each worker (``ru_maxrss``, and of its
load-test children), "false ok" (a mutated file that kept its seed's sidecar but
whose unit is judged usable), units missing from the verdict, and the finding
kinds produced (top 10 per format).  Exit status 1 when any acceptance figure fails.

    /work/main/.venv/bin/python benchmarks/bench_fuzz.py --n 10000 --seed 0 --out /tmp/fuzz.json
    /work/main/.venv/bin/python benchmarks/bench_fuzz.py --quick
    /work/main/.venv/bin/python benchmarks/bench_fuzz.py --write-test-seeds tests/fuzz_seeds

Problem files are rebuilt (deterministically, from ``--seed``, their index and the seeds) under
``--repro`` with a ``what.json`` and the run's seeds (``seeds/``: DCP ``.metadata`` and legacy storage keys
differ from build to build); ``--show I --seed S --seeds-dir REPRO/seeds`` audits one alone with
``CKPTAUDIT_RAISE_AUDIT_ERRORS=1``.
Nothing here unpickles a mutated file: the harness only builds seeds with the real
libraries and edits bytes (``zipfile`` reads a seed's records, never unpickles them).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import json
import os
import pickletools
import random
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

FORMATS = ("torch_zip", "torch_legacy", "safetensors", "dcp_metadata", "dcp_data", "hf_index", "hf_trainer_state")
#: Seconds one file may be examined (summed over the stages) before it counts as a hang.
TIMEOUT_S = 10.0
#: Acceptance bound on each worker's peak RSS, MiB.
RSS_LIMIT_MIB = 1024
#: Config of every fuzz audit: the load test stays on (it is part of examining a file), with a short
#: timeout so a loader that stalls becomes the audit's own load_timeout finding well inside TIMEOUT_S.
FUZZ_CFG = {"load": {"enabled": True, "timeout_seconds": 4, "memory_limit_mib": 4096}}
#: Units per run folder by format (folder units carry more files and load tests).
BATCH = {"torch_zip": 100, "torch_legacy": 100, "safetensors": 100, "dcp_metadata": 100, "dcp_data": 100,
         "hf_index": 60, "hf_trainer_state": 40}
#: Files the role-aware "false ok" check allows a warm start for: roles.py weighs damage to training
#: state (trainer_state.json) as leaving the weights for a warm start, never a resume.
TRAINING_STATE_TARGETS = ("trainer_state.json",)

REPO = C.REPO
SHARED_CASES = Path(os.environ.get("CKPTAUDIT_CASES", REPO.parent / "shared" / "cases"))
TEST_CASES = REPO / "tests" / "cases"


# =============================================================== seeds (real libraries)

def _tiny_training(torch, seed: int = 0):
    """A tiny MLP trained 3 AdamW steps with a LambdaLR scheduler (real state dicts)."""
    torch.manual_seed(seed)
    nn = torch.nn
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for _ in range(3):
        opt.zero_grad()
        m(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        sch.step()
    return m, opt, sch


def build_seeds(dest: Path, *, small: bool = False) -> dict:
    """Write seed units under ``dest/<format>/<seed>/`` and ``dest/seeds.json``; return the manifest.

    ``small``: only generated seeds, kept tiny (the committed ``tests/fuzz_seeds``); otherwise
    also copies of the healthy case folders that exist here.  Imports torch, safetensors,
    torch.distributed.checkpoint and (when installed) transformers: run it in a child process.
    """
    import warnings

    import torch
    from safetensors.torch import save_file

    warnings.filterwarnings("ignore")
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    man: Dict[str, List[dict]] = {f: [] for f in FORMATS}

    def add(fmt: str, name: str, files: Dict[str, Any], target: str, source: str) -> None:
        d = dest / fmt / name
        d.mkdir(parents=True, exist_ok=True)
        for rel, src in files.items():
            p = d / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(src, (bytes, bytearray)):
                p.write_bytes(src)
            else:
                shutil.copyfile(src, p)
        man[fmt].append({"name": name, "dir": f"{fmt}/{name}", "target": target, "files": sorted(files),
                         "source": source})

    tmp = Path(tempfile.mkdtemp(prefix="ckptaudit-fuzz-seeds-"))
    try:
        m, opt, sch = _tiny_training(torch)
        train = {"model": m.state_dict(), "optimizer": opt.state_dict(), "scheduler": sch.state_dict(),
                 "step": 3, "epoch": 0, "model_args": {"d_in": 8, "d_hidden": 16, "d_out": 4}}
        if not small:
            train["rng_state"] = torch.get_rng_state()
        p = tmp / "train.pt"
        torch.save(train, p)
        add("torch_zip", "tiny_train", {"ckpt.pt": p}, "ckpt.pt", "torch.save of an MLP + AdamW + LambdaLR dict")
        p = tmp / "weights.pt"
        torch.save(m.state_dict(), p)
        add("torch_zip", "tiny_state_dict", {"ckpt.pt": p}, "ckpt.pt", "torch.save of a model state_dict")
        p = tmp / "train_legacy.pt"
        torch.save(train, p, _use_new_zipfile_serialization=False)
        add("torch_legacy", "tiny_train", {"ckpt.pt": p}, "ckpt.pt",
            "torch.save(_use_new_zipfile_serialization=False) of the training dict")
        p = tmp / "weights_legacy.pt"
        torch.save(m.state_dict(), p, _use_new_zipfile_serialization=False)
        add("torch_legacy", "tiny_state_dict", {"ckpt.pt": p}, "ckpt.pt",
            "torch.save(_use_new_zipfile_serialization=False) of a state_dict")
        p = tmp / "model.safetensors"
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(p), metadata={"format": "pt"})
        add("safetensors", "tiny", {"model.safetensors": p}, "model.safetensors", "safetensors.torch.save_file")
        p = tmp / "mixed.safetensors"
        save_file({"w_bf16": torch.ones(3, 5, dtype=torch.bfloat16), "idx_i64": torch.arange(7),
                   "mask": torch.tensor([True, False, True]), "zero": torch.zeros(0), "s": torch.tensor(2.5)},
                  str(p))
        add("safetensors", "dtypes", {"model.safetensors": p}, "model.safetensors",
            "safetensors.torch.save_file of bf16/int64/bool/empty/scalar tensors")
        import torch.distributed.checkpoint as dcp

        d = tmp / "dcp"
        dcp.save({"model": m.state_dict(), "optim": opt.state_dict(), "step": 3}, checkpoint_id=str(d),
                 no_dist=True)
        files = {".metadata": d / ".metadata", "__0_0.distcp": d / "__0_0.distcp"}
        add("dcp_metadata", "tiny", files, ".metadata", "torch.distributed.checkpoint.save(no_dist=True)")
        man["dcp_data"].append(dict(man["dcp_metadata"][-1], target="__0_0.distcp"))  # same folder
        try:
            _hf_seeds(tmp, add, small)
        except ImportError:
            print("# transformers is not installed: HF seeds from the case folders only", file=sys.stderr)
        if not small:
            _case_seeds(add, man)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"schema": "ckptaudit.fuzz-seeds/1", "formats": man,
           "made_with": {"torch": torch.__version__}}
    (dest / "seeds.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _hf_seeds(tmp: Path, add: Callable, small: bool) -> None:
    import logging

    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerState

    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    d = tmp / "hf_sharded"
    model.save_pretrained(d, max_shard_size="4KB" if small else "6KB")
    files = {p.name: p for p in sorted(d.iterdir()) if p.is_file()}
    add("hf_index", "gpt2_sharded", files, "model.safetensors.index.json",
        f"transformers {transformers.__version__} save_pretrained(max_shard_size=…) of a tiny GPT-2")
    d1 = tmp / "hf_single"
    model.save_pretrained(d1)
    st = TrainerState(global_step=40, max_steps=100, epoch=0.4, num_train_epochs=1, logging_steps=10,
                      save_steps=20, train_batch_size=8,
                      log_history=[{"loss": 3.2 - 0.1 * i, "grad_norm": 1.5, "learning_rate": 1e-4,
                                    "epoch": 0.1 * i, "step": 10 * i} for i in range(1, 5)])
    st.save_to_json(str(tmp / "trainer_state.json"))
    files = {"trainer_state.json": tmp / "trainer_state.json", "model.safetensors": d1 / "model.safetensors",
             "config.json": d1 / "config.json"}
    add("hf_trainer_state", "trainer_state_log", files, "trainer_state.json",
        f"transformers {transformers.__version__} TrainerState.save_to_json beside save_pretrained weights")


def _case_seeds(add: Callable, man: Dict[str, List[dict]]) -> None:
    """Copies of real healthy files from the case folders, when present."""
    def have(*ps: Path) -> bool:
        return all(p.is_file() for p in ps)

    p = SHARED_CASES / "ok_full_torch" / "ckpt.pt"
    if have(p):
        add("torch_zip", "case_ok_full_torch", {"ckpt.pt": p}, "ckpt.pt", "case ok_full_torch")
    p = TEST_CASES / "ok_fw_epoch_cadence_scheduler" / "checkpoint_000010.pt"
    if have(p):
        add("torch_zip", "case_plain_loop", {"ckpt.pt": p}, "ckpt.pt", "framework fixture: plain loop torch.save")
    p = TEST_CASES / "ok_fw_lightning" / "checkpoints" / "epoch=1-step=20.ckpt"
    if have(p):
        add("torch_zip", "case_lightning", {"ckpt.pt": p}, "ckpt.pt", "framework fixture: Lightning .ckpt")
    p = SHARED_CASES / "ok_safetensors" / "model.safetensors"
    if have(p):
        add("safetensors", "case_ok_safetensors", {"model.safetensors": p}, "model.safetensors",
            "case ok_safetensors")
    p = TEST_CASES / "ok_fw_accelerate" / "checkpoints" / "checkpoint_2" / "model.safetensors"
    if have(p):
        add("safetensors", "case_accelerate", {"model.safetensors": p}, "model.safetensors",
            "framework fixture: accelerate save_state")
    d = SHARED_CASES / "ok_dcp" / "step-6"
    if have(d / ".metadata", d / "__0_0.distcp"):
        files = {".metadata": d / ".metadata", "__0_0.distcp": d / "__0_0.distcp"}
        add("dcp_metadata", "case_ok_dcp", files, ".metadata", "case ok_dcp/step-6")
        man["dcp_data"].append(dict(man["dcp_metadata"][-1], target="__0_0.distcp"))
    d = SHARED_CASES / "ok_hf_sharded"
    names = ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    if have(*(d / n for n in names)):
        add("hf_index", "case_ok_hf_sharded", {n: d / n for n in names}, names[0], "case ok_hf_sharded")
    d = TEST_CASES / "fw_hf_trainer_weights_deleted" / "checkpoint-20"
    if d.is_dir() and have(d / "trainer_state.json"):
        files = {p.name: p for p in sorted(d.iterdir()) if p.is_file()}
        add("hf_trainer_state", "case_hf_trainer", files, "trainer_state.json",
            "framework fixture: HF Trainer checkpoint-20 (transformers 5.24)")


def build_seeds_in_child(dest: Path, small: bool = False) -> dict:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import bench_fuzz as B; "
            "B.build_seeds(sys.argv[2], small=sys.argv[3] == '1')")
    p = subprocess.run([C.PYTHON, "-c", code, str(Path(__file__).parent), str(dest), "1" if small else "0"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"building seeds failed:\n{p.stderr[-4000:]}")
    return load_seeds(dest)


def load_seeds(root: Path) -> dict:
    """{format: [seed entry with ``root`` and ``target_bytes``]} of a seed folder."""
    root = Path(root)
    doc = json.loads((root / "seeds.json").read_text())
    out: Dict[str, List[dict]] = {}
    for fmt, seeds in doc["formats"].items():
        out[fmt] = []
        for s in seeds:
            s = dict(s, root=str(root / s["dir"]))
            s["target_bytes"] = (root / s["dir"] / s["target"]).read_bytes()
            out[fmt].append(s)
    return out


# =============================================================== mutations

INTERESTING = (0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 2 ** 31 - 1, 2 ** 31,
               2 ** 32 - 1, 2 ** 32, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1)


def _le(v: int, n: int) -> bytes:
    return (v % (1 << (8 * n))).to_bytes(n, "little")


def _pos(rng: random.Random, n: int, head_bias: float = 0.4) -> int:
    """A position in [0, n), biased toward the first 512 bytes (headers live there)."""
    if n <= 0:
        return 0
    if rng.random() < head_bias:
        return rng.randrange(min(n, 512))
    return rng.randrange(n)


def _value(rng: random.Random, width: int, old: Optional[int] = None) -> int:
    r = rng.random()
    if old is not None and r < 0.25:
        return max(0, old + rng.choice((-64, -8, -2, -1, 1, 2, 8, 64, old, -old)))
    if r < 0.85:
        return rng.choice(INTERESTING) % (1 << (8 * width))
    return rng.getrandbits(8 * width)


def m_bitflip(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    b = bytearray(d)
    k = rng.choice((1, 1, 1, 2, 3, 8, 32))
    for _ in range(k):
        i = _pos(rng, len(b))
        if b:
            b[i] ^= 1 << rng.randrange(8)
    return bytes(b), f"bitflip x{k}"


def m_interesting(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    w = rng.choice((1, 2, 4, 8))
    v = rng.choice(INTERESTING)
    i = _pos(rng, max(1, len(d) - w + 1))
    return d[:i] + _le(v, w) + d[i + w:], f"overwrite {w}B at {i} with {v:#x}"


def m_truncate(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    r = rng.random()
    if r < 0.3:
        i = max(0, len(d) - rng.randint(1, 64))
    elif r < 0.5:
        i = rng.randrange(min(len(d), 1024) or 1)
    else:
        i = rng.randrange(len(d) or 1)
    return d[:i], f"truncate at {i} of {len(d)}"


def m_zero_span(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    n = rng.choice((1, 4, 16, 64, 512, 4096, 65536))
    i = _pos(rng, len(d), 0.2)
    n = min(n, len(d) - i)
    tail = rng.random() < 0.15
    if tail:
        i = max(0, len(d) - n)
    return d[:i] + bytes(n) + d[i + n:], f"zero {n}B at {i}" + (" (tail)" if tail else "")


def m_dup_chunk(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    a = _pos(rng, len(d))
    b = min(len(d), a + rng.choice((1, 8, 64, 512, 4096)))
    c = _pos(rng, len(d) + 1)
    return d[:c] + d[a:b] + d[c:], f"duplicate [{a},{b}) at {c}"


def m_delete_chunk(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    a = _pos(rng, len(d))
    b = min(len(d), a + rng.choice((1, 4, 30, 64, 512, 4096)))
    return d[:a] + d[b:], f"delete [{a},{b})"


def m_insert(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    n = rng.choice((1, 8, 64, 512, 4096))
    kind = rng.choice(("random", "zero", "ff", "PK", "pickle"))
    blob = {"random": bytes(rng.getrandbits(8) for _ in range(n)), "zero": bytes(n), "ff": b"\xff" * n,
            "PK": (b"PK\x03\x04" + bytes(26)) * max(1, n // 30), "pickle": b"\x80\x02}q\x00." * max(1, n // 7)}[kind]
    c = _pos(rng, len(d) + 1)
    return d[:c] + blob + d[c:], f"insert {len(blob)}B {kind} at {c}"


def m_splice(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    other = rng.choice(pool) if pool else d
    a = rng.randrange(len(d) + 1)
    b = rng.randrange(len(other) + 1)
    return d[:a] + other[b:], f"splice [0,{a}) + other seed [{b},end)"


def m_append(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    extra = rng.choice((b"\x00" * 100, b"garbage\n", d[:512], b"PK\x05\x06" + bytes(18)))
    return d + extra, f"append {len(extra)}B"


GENERIC = [m_bitflip, m_interesting, m_truncate, m_zero_span, m_dup_chunk, m_delete_chunk, m_insert, m_splice,
           m_append]

# ------------------------------------------------------------------ zip structures

ZIP_FIELDS = {
    b"PK\x03\x04": ("local", {"version_needed": (4, 2), "flags": (6, 2), "method": (8, 2), "mtime": (10, 2),
                              "crc": (14, 4), "csize": (18, 4), "usize": (22, 4), "name_len": (26, 2),
                              "extra_len": (28, 2)}),
    b"PK\x01\x02": ("central", {"version_made": (4, 2), "version_needed": (6, 2), "flags": (8, 2), "method": (10, 2),
                                "crc": (16, 4), "csize": (20, 4), "usize": (24, 4), "name_len": (28, 2),
                                "extra_len": (30, 2), "comment_len": (32, 2), "disk_start": (34, 2),
                                "ext_attr": (38, 4), "local_offset": (42, 4)}),
    b"PK\x05\x06": ("eocd", {"disk": (4, 2), "cd_disk": (6, 2), "entries_disk": (8, 2), "entries": (10, 2),
                             "cd_size": (12, 4), "cd_offset": (16, 4), "comment_len": (20, 2)}),
    b"PK\x06\x06": ("zip64_eocd", {"record_size": (4, 8), "version_needed": (14, 2), "disk": (16, 4),
                                   "cd_disk": (20, 4), "entries_disk": (24, 8), "entries": (32, 8),
                                   "cd_size": (40, 8), "cd_offset": (48, 8)}),
    b"PK\x06\x07": ("zip64_locator", {"disk": (4, 4), "eocd64_offset": (8, 8), "total_disks": (16, 4)}),
    b"PK\x07\x08": ("descriptor", {"crc": (4, 4), "csize": (8, 4), "usize": (12, 4)}),
}


def _zip_records(d: bytes) -> List[Tuple[int, bytes]]:
    out = []
    for sig in ZIP_FIELDS:
        i = d.find(sig)
        while i >= 0:
            out.append((i, sig))
            i = d.find(sig, i + 1)
    return sorted(out)


def m_zip_field(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    recs = _zip_records(d)
    if not recs:
        return m_interesting(d, rng, pool)
    # weight the structures the reader trusts most: the end records and the central directory
    tails = [r for r in recs if r[1] in (b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07")]
    off, sig = rng.choice(tails) if tails and rng.random() < 0.3 else rng.choice(recs)
    kind, fields = ZIP_FIELDS[sig]
    name = rng.choice(sorted(fields))
    fo, w = fields[name]
    if off + fo + w > len(d):
        return m_interesting(d, rng, pool)
    old = int.from_bytes(d[off + fo: off + fo + w], "little")
    v = _value(rng, w, old)
    return d[:off + fo] + _le(v, w) + d[off + fo + w:], f"zip {kind}@{off}.{name} {old:#x}->{v:#x}"


def m_zip_name(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    recs = [r for r in _zip_records(d) if r[1] in (b"PK\x03\x04", b"PK\x01\x02")]
    if not recs:
        return m_bitflip(d, rng, pool)
    off, sig = rng.choice(recs)
    base = 30 if sig == b"PK\x03\x04" else 46
    nlo = 26 if sig == b"PK\x03\x04" else 28
    if off + base > len(d):
        return m_bitflip(d, rng, pool)
    n = struct.unpack_from("<H", d, off + nlo)[0]
    name = d[off + base: off + base + n]
    choice = rng.choice(("char", "pkl", "prefix", "dotdot", "abs", "nul"))
    if choice == "char" and name:
        i = rng.randrange(len(name))
        new = name[:i] + bytes([rng.choice(b"/.\\0aZ\x00\xff")]) + name[i + 1:]
    elif choice == "pkl":
        new = name.replace(b"data.pkl", rng.choice((b"data.pkk", b"data.pkl/", b"DATA.PKL")))
    elif choice == "prefix":
        new = b"other/" + name.split(b"/", 1)[-1]
    elif choice == "dotdot":
        new = b"../" + name
    elif choice == "abs":
        new = b"/" + name
    else:
        new = name[: len(name) // 2] + b"\x00" + name[len(name) // 2 + 1:]
    if len(new) != len(name):  # keep the record sizes: only same-length renames stay aligned
        new = (new + b"_" * len(name))[: len(name)]
    return d[:off + base] + new + d[off + base + n:], f"zip {'local' if base == 30 else 'central'}@{off} name " \
                                                      f"{name[:40]!r}->{new[:40]!r}"


def read_zip_members(d: bytes) -> Optional[List[Tuple[str, bytes]]]:
    """(name, bytes) of every record of a *seed* archive, in order (zipfile; nothing unpickled)."""
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(d)) as z:
            return [(i.filename, z.read(i.filename)) for i in z.infolist()]
    except Exception:  # noqa: BLE001 - a seed that zipfile cannot read is simply not re-zipped
        return None


def write_torch_zip(members: Sequence[Tuple[str, bytes]], align: int = 64) -> bytes:
    """A zip laid out as torch's PyTorchStreamWriter writes it: STORED records, flags 0x0808 with data
    descriptors, ``FB`` extra padding so each record's data is ``align``-aligned, a ZIP64 end record,
    locator and end-of-central-directory record."""
    out = bytearray()
    central = bytearray()
    for name, data in members:
        nb = name.encode("utf-8")
        off = len(out)
        pad = (-(off + 30 + len(nb) + 4)) % align
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        crc = zlib.crc32(data) & 0xFFFFFFFF
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, 0x0808, 0, 0, 0, 0, 0, 0, len(nb), len(extra))
        out += nb + extra + data
        out += struct.pack("<4sIII", b"PK\x07\x08", crc, len(data), len(data))
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 0, 0, 0x0808, 0, 0, 0, crc, len(data),
                               len(data), len(nb), 0, 0, 0, 0, 0, off) + nb
    cd_off = len(out)
    out += central
    z64 = len(out)
    n = len(members)
    out += struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 0x031E, 45, 0, 0, n, n, len(central), cd_off)
    out += struct.pack("<4sIQI", b"PK\x06\x07", 0, z64, 1)
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, len(central), cd_off, 0)
    return bytes(out)


def m_zip_pickle(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    """Mutate data.pkl's opcodes and re-zip (CRCs right, layout as torch writes it)."""
    members = read_zip_members(d)
    if not members:
        return m_zip_field(d, rng, pool)
    i = next((k for k, (n, _) in enumerate(members) if n.endswith("data.pkl")), None)
    if i is None:
        return m_zip_field(d, rng, pool)
    new, desc = mutate_pickle(members[i][1], rng)
    members = list(members)
    members[i] = (members[i][0], new)
    if rng.random() < 0.1:  # and, sometimes, a record damaged beside it
        j = rng.randrange(len(members))
        nm, blob = members[j]
        if blob:
            members[j] = (nm, blob[: rng.randrange(len(blob))])
            desc += f"; record {nm} cut"
    return write_torch_zip(members), f"data.pkl {desc}; re-zipped"


def m_zip_storage(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    """Re-zip with one storage record shortened, lengthened, dropped or duplicated (valid CRCs)."""
    members = read_zip_members(d)
    if not members:
        return m_zip_field(d, rng, pool)
    data_ix = [k for k, (n, _) in enumerate(members) if "/data/" in n]
    if not data_ix:
        return m_zip_field(d, rng, pool)
    k = rng.choice(data_ix)
    nm, blob = members[k]
    op = rng.choice(("short", "long", "drop", "dup", "reorder"))
    members = list(members)
    if op == "short":
        members[k] = (nm, blob[: max(0, len(blob) - rng.choice((1, 4, len(blob))))])
    elif op == "long":
        members[k] = (nm, blob + bytes(rng.choice((1, 4, 4096))))
    elif op == "drop":
        del members[k]
    elif op == "dup":
        members.insert(k, (nm, blob[::-1]))
    else:
        rng.shuffle(members)
    return write_torch_zip(members), f"storage record {nm} {op}; re-zipped"


# ------------------------------------------------------------------ pickles

_OPCODE_BYTES = [op.code.encode("latin-1") for op in pickletools.opcodes]
_STR_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "SHORT_BINSTRING", "BINSTRING", "UNICODE", "STRING"}
_INT_ARGS = {"BININT": 4, "BININT1": 1, "BININT2": 2, "BINGET": 1, "LONG_BINGET": 4, "BINPUT": 1,
             "LONG_BINPUT": 4, "PROTO": 1, "FRAME": 8, "SHORT_BINUNICODE": 1, "BINUNICODE": 4, "BINUNICODE8": 8,
             "SHORT_BINBYTES": 1, "BINBYTES": 4, "BINBYTES8": 8, "SHORT_BINSTRING": 1, "BINSTRING": 4,
             "LONG1": 1, "LONG4": 4, "EXT1": 1, "EXT2": 2, "EXT4": 4, "BYTEARRAY8": 8}
STRINGS = ("0", "1", "999999", "-1", "", "../x", "FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage",
           "BoolStorage", "ComplexDoubleStorage", "QInt8Storage", "NotAStorage", "cpu", "cuda:7", "meta",
           "storage", "state", "param_groups", "exp_avg", "exp_avg_sq", "step", "model", "weight",
           "__metadata__", "torch._utils", "_rebuild_tensor_v2", "_rebuild_parameter", "collections",
           "OrderedDict", "A" * 70000, "\u00e9\u4e2d", "a.b.c.d.e.f", "storage_data", "state_dict_metadata",
           "relative_path", "offset", "length", "__0_0.distcp", "../../etc/hostname", "\ud800w", "x\udfff")
GLOBALS = (("torch._utils", "_rebuild_tensor_v2"), ("torch", "FloatStorage"), ("torch", "BFloat16Storage"),
           ("collections", "OrderedDict"), ("builtins", "getattr"), ("builtins", "set"), ("os", "getcwd"),
           ("ckptaudit_fuzz_absent", "Thing"), ("torch", "Size"), ("torch._tensor", "_rebuild_from_type_v2"),
           ("torch.distributed.checkpoint.metadata", "Metadata"), ("torch.distributed.checkpoint.filesystem",
                                                                   "_StorageInfo"),
           ("__builtin__", "set"), ("numpy.core.multiarray", "scalar"), ("torch", "bfloat16"),
           ("torch._utils", "_rebuild_parameter"), ("copyreg", "_reconstructor"), ("torch.nn.parameter", ""))
SNIPPETS = (
    b"(" * 1000, b"(" * 100000, b"]" * 50000, b"}" * 1000 + b"." , b"h\xff", b"j\xff\xff\xff\x7f",
    b"r\xff\xff\xff\xff", b".", b"0", b"1", b"2", b"Q", b"R", b"b", b"s", b"u", b"e", b"a", b"t", b"\x85",
    b"\x86", b"\x87", b"\x8a\x08" + _le(2 ** 63 - 1, 8), b"\x8a\x09" + b"\xff" * 9, b"\x8b\xff\xff\xff\x7f",
    b"\x95" + _le(2 ** 62, 8), b"X\xff\xff\xff\xff", b"\x8e" + _le(2 ** 63, 8), b"\x94", b"\x93",
    b"cos\ngetcwd\n)R", b"]q\x00h\x00a", b"]q\x00h\x00h\x00\x86e" * 8, b"(]q\x01h\x01h\x01t" * 4,
    b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu\x8a\x08"
    + _le(2 ** 62, 8) + b"tQ",
    b"\x82\x01", b"\x83\x01\x00", b"\x84\xff\xff\xff\x7f", b"N" * 10000 + b"\x85" * 3, b"\x8c\x00\x94\x94\x93",
)


def pickle_ops(data: bytes) -> List[Tuple[int, int, str]]:
    """(start, end, opname) of the opcodes of the pickle at the start of ``data`` (as far as they decode)."""
    ops: List[Tuple[int, str]] = []
    try:
        for op, _arg, pos in pickletools.genops(data):
            ops.append((pos, op.name))
            if op.name == "STOP":
                break
    except Exception:  # noqa: BLE001 - damaged seeds decode partly
        pass
    out = []
    for k, (pos, name) in enumerate(ops):
        end = ops[k + 1][0] if k + 1 < len(ops) else (pos + 1 if name == "STOP" else len(data))
        out.append((pos, end, name))
    return out


def _enc_str(opname: str, s: str) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    if opname in ("SHORT_BINUNICODE",) and len(b) < 256:
        return b"\x8c" + bytes([len(b)]) + b
    if opname in ("SHORT_BINSTRING", "BINSTRING"):
        return b"T" + struct.pack("<I", len(b)) + b
    return b"X" + struct.pack("<I", len(b)) + b


def mutate_pickle(data: bytes, rng: random.Random) -> Tuple[bytes, str]:
    """One opcode-aware mutation of a pickle (at op boundaries, so the rest still decodes)."""
    ops = pickle_ops(data)
    if len(ops) < 2:
        return m_bitflip(data, rng, [])
    choice = rng.choice(("op_replace", "op_delete", "op_dup", "op_swap", "arg_int", "arg_int", "str", "str",
                         "global", "insert", "insert", "truncate", "proto"))
    s, e, name = rng.choice(ops)
    if choice == "op_replace":
        b = rng.choice(_OPCODE_BYTES)
        return data[:s] + b + data[s + 1:], f"op {name}@{s} -> {b!r}"
    if choice == "op_delete":
        return data[:s] + data[e:], f"delete op {name}@{s}"
    if choice == "op_dup":
        n = rng.choice((1, 2, 100))
        return data[:e] + data[s:e] * n + data[e:], f"repeat op {name}@{s} x{n}"
    if choice == "op_swap":
        k = rng.randrange(len(ops) - 1)
        (s1, e1, n1), (s2, e2, n2) = ops[k], ops[k + 1]
        return data[:s1] + data[s2:e2] + data[s1:e1] + data[e2:], f"swap ops {n1}@{s1} {n2}@{s2}"
    if choice == "arg_int":
        cand = [o for o in ops if o[2] in _INT_ARGS and o[0] + 1 + _INT_ARGS[o[2]] <= len(data)]
        if cand:
            s, e, name = rng.choice(cand)
            w = _INT_ARGS[name]
            old = int.from_bytes(data[s + 1: s + 1 + w], "little")
            v = _value(rng, w, old)
            return data[:s + 1] + _le(v, w) + data[s + 1 + w:], f"arg of {name}@{s} {old:#x}->{v:#x}"
    if choice == "str":
        cand = [o for o in ops if o[2] in _STR_OPS]
        if cand:
            s, e, name = rng.choice(cand)
            new = rng.choice(STRINGS)
            return data[:s] + _enc_str(name, new) + data[e:], f"string {name}@{s} -> {new[:20]!r}"
    if choice == "global":
        cand = [o for o in ops if o[2] == "GLOBAL"]
        if cand:
            s, e, name = rng.choice(cand)
            mod, nm = rng.choice(GLOBALS)
            return data[:s] + b"c" + f"{mod}\n{nm}\n".encode() + data[e:], f"GLOBAL@{s} -> {mod}.{nm}"
        cand = [o for o in ops if o[2] == "STACK_GLOBAL"]
        if cand:
            s, e, name = rng.choice(cand)
            return data[:s] + b"\x93\x93" + data[e:], f"STACK_GLOBAL@{s} doubled"
    if choice == "truncate":
        return data[:s], f"pickle cut before {name}@{s}"
    if choice == "proto" and data[:1] == b"\x80":
        v = rng.choice((0, 1, 2, 3, 4, 5, 6, 255))
        return b"\x80" + bytes([v]) + data[2:], f"PROTO -> {v}"
    snip = rng.choice(SNIPPETS)
    return data[:s] + snip + data[s:], f"insert {snip[:12]!r}… ({len(snip)}B) before {name}@{s}"


def m_pickle(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    return mutate_pickle(d, rng)


def legacy_parts(d: bytes) -> Tuple[List[Tuple[int, int]], int]:
    """(start, end) of the five pickles of a legacy torch.save seed, and where the storages start."""
    spans = []
    pos = 0
    for _ in range(5):
        ops = pickle_ops(d[pos:])
        if not ops or ops[-1][2] != "STOP":
            break
        spans.append((pos, pos + ops[-1][1]))
        pos += ops[-1][1]
    return spans, pos


def m_legacy(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    spans, data_start = legacy_parts(d)
    if len(spans) < 5:
        return m_pickle(d, rng, pool)
    r = rng.random()
    if r < 0.6:
        k = rng.choice((0, 1, 2, 3, 3, 3, 4, 4))
        a, b = spans[k]
        new, desc = mutate_pickle(d[a:b], rng)
        return d[:a] + new + d[b:], f"legacy pickle {k + 1}/5: {desc}"
    # the 8-byte element counts that prefix each storage's raw bytes: walk them as the reader would,
    # using the first record's count and the element size 4 (float32 seeds) to find the next ones
    prefixes = []
    pos = data_start
    while pos + 8 <= len(d) and len(prefixes) < 64:
        n = struct.unpack_from("<q", d, pos)[0]
        prefixes.append(pos)
        if n < 0 or pos + 8 + 4 * n > len(d):
            break
        pos += 8 + 4 * n
    if not prefixes:
        return m_interesting(d, rng, pool)
    p = rng.choice(prefixes)
    old = struct.unpack_from("<Q", d, p)[0]
    v = _value(rng, 8, old)
    return d[:p] + _le(v, 8) + d[p + 8:], f"legacy storage count@{p} {old}->{v}"


# ------------------------------------------------------------------ JSON

JSON_VALUES = (0, -1, 1, 2 ** 31, 2 ** 63, -2 ** 63, 2 ** 64, 10 ** 30, 1e308, -1e308, 0.5, -0.0, "", "0", "x",
               "NaN", "../../../etc/hostname", "/dev/zero", ".", "..", "model.safetensors.index.json",
               "trainer_state.json", "a/b/c.safetensors", "\u0000", None, True, False, [], {}, [1, 2, 3],
               {"a": 1}, "\u00e9" * 1000, "checkpoint-1", "model-00001-of-00002.safetensors", "\ud800",
               "sub/model-00001-of-00002.safetensors")
JSON_TEXT_VALUES = ("NaN", "Infinity", "-Infinity", "1e999999", "-1e999999", "9" * 5000, "1" * 300,
                    "[" * 100000 + "]" * 100000, "[" * 1000 + "]" * 1000, '{"a":' * 5000 + "1" + "}" * 5000,
                    '"\\ud800"', '"\\u0000"', "[" + ",".join(["1"] * 100000) + "]")


def _json_nodes(obj: Any, path: Tuple = (), out: Optional[list] = None, limit: int = 5000) -> list:
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    out.append(path)
    if isinstance(obj, dict):
        for k in list(obj)[:1000]:
            _json_nodes(obj[k], path + (k,), out, limit)
    elif isinstance(obj, list):
        for i in range(min(len(obj), 1000)):
            _json_nodes(obj[i], path + (i,), out, limit)
    return out


def _get(obj: Any, path: Tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _set(obj: Any, path: Tuple, v: Any) -> Any:
    if not path:
        return v
    _get(obj, path[:-1])[path[-1]] = v
    return obj


_MARK = "\u0001FUZZTEXT\u0001"


def mutate_json(data: bytes, rng: random.Random, fmt: str = "") -> Tuple[bytes, str]:
    """One structure-aware mutation of a JSON document (numbers, strings, keys, nesting, text)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return m_bitflip(data, rng, [])
    op = rng.choice(("value", "value", "value", "text_value", "delete", "rename", "wrap", "dupkey", "special",
                     "special", "text"))
    nodes = _json_nodes(obj)
    path = rng.choice(nodes)
    desc = ""
    if op == "special":
        if fmt == "hf_index" and isinstance(obj, dict) and isinstance(obj.get("weight_map"), dict) and obj["weight_map"]:
            wm = obj["weight_map"]
            k = rng.choice(sorted(wm))
            sub = rng.choice(("target", "target", "drop", "add", "total", "type"))
            if sub == "target":
                wm[k] = rng.choice(JSON_VALUES)
                desc = f"weight_map[{k!r}] -> {str(wm[k])[:40]!r}"
            elif sub == "drop":
                del wm[k]
                desc = f"weight_map drops {k!r}"
            elif sub == "add":
                wm[rng.choice(("extra.weight", "", "a" * 300, k + ".x"))] = rng.choice(sorted(set(map(str, wm.values()))))
                desc = "weight_map gains a tensor"
            elif sub == "total":
                obj.setdefault("metadata", {})
                v = rng.choice(JSON_VALUES)
                if isinstance(obj["metadata"], dict):
                    obj["metadata"]["total_size"] = v
                desc = f"metadata.total_size -> {str(v)[:40]!r}"
            else:
                obj["weight_map"] = rng.choice(([list(wm)], "x", None, 3, [[k, "a.safetensors"]]))
                desc = "weight_map type changed"
        elif fmt == "hf_trainer_state" and isinstance(obj, dict):
            key = rng.choice(("global_step", "epoch", "max_steps", "log_history", "best_model_checkpoint",
                              "best_metric", "stateful_callbacks", "num_train_epochs"))
            v = rng.choice(JSON_VALUES)
            obj[key] = v
            desc = f"{key} -> {str(v)[:40]!r}"
        else:
            op = "value"
    if op == "value":
        v = rng.choice(JSON_VALUES)
        obj = _set(obj, path, v)
        desc = f"{list(path)[:6]} -> {str(v)[:40]!r}"
    elif op == "text_value":
        obj = _set(obj, path, _MARK)
        tv = rng.choice(JSON_TEXT_VALUES)
        text = json.dumps(obj, indent=rng.choice((None, 2))).replace(json.dumps(_MARK), tv, 1)
        return text.encode("utf-8", "surrogatepass"), f"{list(path)[:6]} -> text {tv[:16]!r}…({len(tv)})"
    elif op == "delete" and path:
        parent = _get(obj, path[:-1])
        del parent[path[-1]]
        desc = f"delete {list(path)[:6]}"
    elif op == "rename" and path and isinstance(_get(obj, path[:-1]), dict):
        parent = _get(obj, path[:-1])
        parent[rng.choice(("", "__proto__", path[-1] + "_", "\u00e9", "weight_map", "global_step"))] = \
            parent.pop(path[-1])
        desc = f"rename key {list(path)[:6]}"
    elif op == "wrap":
        v = _get(obj, path)
        obj = _set(obj, path, rng.choice(([v], {"v": v}, [[[[v]]]])))
        desc = f"wrap {list(path)[:6]}"
    elif op == "dupkey":
        text = json.dumps(obj)
        i = text.find('"')
        if i >= 0:
            j = text.find(":", i)
            k = text.find(",", j)
            if j > 0 and k > 0:
                text = text[:k + 1] + text[i:k] + "," + text[k + 1:]
        return text.encode(), "duplicate a key"
    elif op == "text" or not desc:
        raw = json.dumps(obj, indent=2).encode()
        t = rng.choice(("cut", "bom", "utf8", "trail", "nul", "lead"))
        if t == "cut":
            return raw[: rng.randrange(len(raw) + 1)], "JSON text cut"
        if t == "bom":
            return b"\xef\xbb\xbf" + raw, "UTF-8 BOM"
        if t == "utf8":
            i = rng.randrange(len(raw) + 1)
            return raw[:i] + b"\xc3\x28\xff" + raw[i:], "invalid UTF-8"
        if t == "trail":
            return raw + b"\n{}garbage", "trailing garbage"
        if t == "nul":
            i = rng.randrange(len(raw) + 1)
            return raw[:i] + bytes(64) + raw[i:], "NUL run inside"
        return b" " * 10000 + raw, "leading whitespace"
    return json.dumps(obj, indent=rng.choice((None, 2))).encode("utf-8", "surrogatepass"), desc


def m_json(d: bytes, rng: random.Random, pool, fmt: str = "") -> Tuple[bytes, str]:
    return mutate_json(d, rng, fmt)


# ------------------------------------------------------------------ safetensors

ST_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "U64",
             "F128", "", "f32", 3, None)


def m_safetensors(d: bytes, rng: random.Random, pool) -> Tuple[bytes, str]:
    if len(d) < 9:
        return m_interesting(d, rng, pool)
    n = struct.unpack_from("<Q", d, 0)[0]
    hdr, body = d[8:8 + n], d[8 + n:]
    try:
        obj = json.loads(hdr)
        names = [k for k in obj if k != "__metadata__" and isinstance(obj[k], dict)]
    except ValueError:
        return m_interesting(d, rng, pool)
    op = rng.choice(("hlen", "hlen", "offsets", "offsets", "offsets", "shape", "shape", "dtype", "dtype", "entry",
                     "metadata", "json", "body"))
    desc = op
    keep_len = False
    if op == "hlen":
        v = rng.choice((0, 1, 2, 7, n - 1, n + 1, n + 8, len(d) - 8, len(d) - 7, len(d), 2 ** 31, 2 ** 32,
                        100_000_000, 100_000_001, 2 ** 63, 2 ** 64 - 1, max(0, n - 8)))
        return _le(v, 8) + d[8:], f"header length {n} -> {v}"
    if op in ("offsets", "shape", "dtype", "entry") and names:
        t = rng.choice(names)
        e = obj[t]
        if op == "offsets":
            b, en = (e.get("data_offsets") or [0, 0]) + [0, 0][: 2 - len(e.get("data_offsets") or [])]
            other = obj[rng.choice(names)].get("data_offsets", [0, 0])
            e["data_offsets"] = rng.choice(([0, 0], [b, en + 1], [b - 1, en], [en, b], [b, 2 ** 63], [b, 2 ** 64],
                                            [b, len(body) + 1], [-1, en], list(other), [0.5, 2], ["0", "8"], [b],
                                            [b, en, 0], None, [2 ** 63, 2 ** 63 + en - b], [b + 1, en + 1],
                                            [b, b], [10 ** 30, 10 ** 30]))
            desc = f"{t}.data_offsets -> {e['data_offsets']}"
        elif op == "shape":
            sh = e.get("shape") or []
            e["shape"] = rng.choice(([2 ** 63], [-1], [], [0], [1] * 64, [2 ** 31, 2 ** 31], ["3"], [3.0], None,
                                     sh + sh, sh[::-1], [2 ** 32, 2 ** 32, 2 ** 32], [x + 1 for x in sh]))
            desc = f"{t}.shape -> {str(e['shape'])[:40]}"
        elif op == "dtype":
            e["dtype"] = rng.choice(ST_DTYPES)
            desc = f"{t}.dtype -> {e['dtype']!r}"
        else:
            sub = rng.choice(("del", "bogus", "list", "dupname", "extra_key"))
            if sub == "del":
                del obj[t]
            elif sub == "bogus":
                obj["bogus." + t] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
            elif sub == "list":
                obj[t] = [e]
            elif sub == "dupname":
                obj[t + "\u0000"] = dict(e)
            else:
                e["extra"] = {"nested": [1, 2]}
            desc = f"entry {t} {sub}"
    elif op == "metadata":
        obj["__metadata__"] = rng.choice(({"format": 1}, [], "x", {"a": {"b": "c"}},
                                          {f"k{i}": "v" * 100 for i in range(1000)}, None, {"format": "pt"}))
        desc = f"__metadata__ -> {str(obj['__metadata__'])[:40]}"
    elif op == "json":
        new, desc = mutate_json(hdr, rng, "safetensors_header")
        keep_len = rng.random() < 0.3
        hb = new
        ln = n if keep_len else len(hb)
        return _le(ln, 8) + hb + body, f"header JSON: {desc}" + (" (old length kept)" if keep_len else "")
    elif op == "body":
        return d[:8 + n] + body[: rng.randrange(len(body) + 1)] + (bytes(rng.choice((0, 3, 4096))) if rng.random()
                                                                   < 0.5 else b""), "data buffer cut/padded"
    hb = json.dumps(obj, separators=(",", ":")).encode()
    hb += b" " * ((-len(hb)) % 8)
    keep_len = rng.random() < 0.15
    return _le(n if keep_len else len(hb), 8) + hb + body, desc + (" (old length kept)" if keep_len else "")


# ------------------------------------------------------------------ per format

AWARE: Dict[str, List[Callable]] = {
    "torch_zip": [m_zip_field, m_zip_field, m_zip_name, m_zip_pickle, m_zip_pickle, m_zip_storage],
    "torch_legacy": [m_legacy],
    "safetensors": [m_safetensors],
    "dcp_metadata": [m_pickle],
    "dcp_data": [m_zero_span, m_truncate],
    "hf_index": [lambda d, r, p: m_json(d, r, p, "hf_index")],
    "hf_trainer_state": [lambda d, r, p: m_json(d, r, p, "hf_trainer_state")],
}


def mutate(fmt: str, data: bytes, rng: random.Random, pool: List[bytes]) -> Tuple[bytes, List[str]]:
    """1–3 stacked mutations (format-aware about half the time)."""
    k = 1 if rng.random() < 0.7 else (2 if rng.random() < 0.66 else 3)
    descs = []
    for j in range(k):
        fn = rng.choice(AWARE[fmt]) if rng.random() < 0.55 else rng.choice(GENERIC)
        try:
            data, desc = fn(data, rng, pool)
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, OverflowError) as e:
            desc = f"{getattr(fn, '__name__', 'mutator')} skipped ({type(e).__name__})"
        descs.append(desc)
    return data, descs


# ------------------------------------------------------------------ units

UNIT_NAMES = {"torch_zip": "ckpt_{i:06d}.pt", "torch_legacy": "ckpt_{i:06d}.pt",
              "safetensors": "model_{i:06d}.safetensors", "dcp_metadata": "step-{i}", "dcp_data": "step-{i}",
              "hf_index": "checkpoint-{i}", "hf_trainer_state": "checkpoint-{i}"}


def format_of(i: int) -> str:
    return FORMATS[i % len(FORMATS)]


def _sidecar(path: Path, data: bytes) -> None:
    path.with_name(path.name + ".sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")


def make_unit(run_dir: Path, i: int, seeds: Dict[str, List[dict]], master_seed: int,
              fmt: Optional[str] = None) -> dict:
    """Write mutated file ``i`` as its own unit of ``run_dir``; return what was done (deterministic
    from ``master_seed`` and ``i``)."""
    fmt = fmt or format_of(i)
    rng = random.Random(f"ckptaudit-fuzz/{master_seed}/{i}")
    seed = rng.choice(seeds[fmt])
    orig = seed["target_bytes"]
    pool = [s["target_bytes"] for s in seeds[fmt] if s is not seed] or [orig]
    if rng.random() < 0.05:  # cross-format splices now and then
        pool = pool + [s["target_bytes"] for f in seeds for s in seeds[f]][:8]
    data, descs = mutate(fmt, orig, rng, pool)
    keep_sidecar = rng.random() < 0.5
    unit = UNIT_NAMES[fmt].format(i=i)
    if fmt == "hf_index" and i % 2:  # a plain folder: the index is its own unit (inventory's claim_index)
        unit = f"shards-{i}"
    src = Path(seed["root"])
    if "{i:06d}" in UNIT_NAMES[fmt]:  # a single-file unit
        target = run_dir / unit
        target.write_bytes(data)
        if keep_sidecar:
            _sidecar(target, orig)
    else:
        folder = run_dir / unit
        folder.mkdir()
        for rel in seed["files"]:
            p = folder / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if rel == seed["target"]:
                p.write_bytes(data)
                if keep_sidecar:
                    _sidecar(p, orig)
            else:
                try:
                    os.link(src / rel, p)
                except OSError:
                    shutil.copyfile(src / rel, p)
                if keep_sidecar:
                    _sidecar(p, (src / rel).read_bytes())
        target = folder / seed["target"]
    verdict_unit = f"{unit}/{seed['target']}" if unit.startswith("shards-") else unit
    return {"i": i, "fmt": fmt, "seed": seed["name"], "unit": verdict_unit, "target": seed["target"],
            "mutations": descs, "sidecar": keep_sidecar, "differs": data != orig, "size": len(data),
            "seed_size": len(orig)}


# =============================================================== worker

def _maxrss_kib(who: int = resource.RUSAGE_SELF) -> int:
    return int(resource.getrusage(who).ru_maxrss)


def judge(info: dict, u: Optional[dict]) -> dict:
    """Per-file result from its verdict unit."""
    r = dict(info)
    if u is None:
        r.update(missing=True, usable_for=None, kinds=[], audit_errors=[])
        return r
    kinds = [f["kind"] for f in u["findings"]]
    r.update(missing=False, usable_for=u["usable_for"], kinds=sorted(set(kinds)),
             audit_errors=[{k: f.get(k) for k in ("path", "layer", "message")} | {
                 "detail": {k: v for k, v in (f.get("detail") or {}).items() if k in ("stage", "error_type",
                                                                                        "error")}}
                 for f in u["findings"] if f["kind"] == "audit_error"])
    protected = info["sidecar"] and info["differs"]
    r["checksum_mismatch"] = "checksum_mismatch" in kinds
    r["false_ok_strict"] = bool(protected and u["usable_for"] != "none")
    allowed = "warm-start" if info["target"] in TRAINING_STATE_TARGETS else "none"
    r["false_ok"] = bool(protected and u["usable_for"] not in ("none", allowed))
    return r


def worker_main(seeds_dir: str, master_seed: int, tmp_root: str) -> int:
    """Loop: read a batch ``{"batch", "indices", "fmt"}`` per stdin line, audit it, report JSON lines."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the audit prints goes to stderr, never into the protocol
    sys.stdout = sys.stderr

    def send(msg: dict) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    import ckptaudit.stages.liveness as L
    from ckptaudit.pipeline import audit_in_process
    import torch  # noqa: F401 - imported before any batch (the load test imports it on first use)

    seeds = load_seeds(Path(seeds_dir))
    orig_guard = L.guard
    times: Dict[str, float] = collections.defaultdict(float)

    def timed_guard(stage, unit, fn, fallback):
        name = unit.get("unit", "?")
        send({"ev": "start", "stage": stage, "unit": name})
        t0 = time.perf_counter()
        r0 = _maxrss_kib()
        try:
            return orig_guard(stage, unit, fn, fallback)
        finally:
            dt = time.perf_counter() - t0
            times[name] += dt
            r1 = _maxrss_kib()
            send({"ev": "end", "stage": stage, "unit": name, "s": dt,
                  **({"rss_jump_kib": [r0, r1]} if r1 - r0 > (64 << 10) else {})})

    L.guard = timed_guard
    send({"ev": "ready", "pid": os.getpid(), "maxrss_kib": _maxrss_kib()})
    for line in sys.stdin:
        job = json.loads(line)
        times.clear()
        work = Path(tmp_root) / f"b{job['batch']}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        run_dir = work / "run"
        run_dir.mkdir(parents=True)
        infos = [make_unit(run_dir, i, seeds, master_seed, job.get("fmt")) for i in job["indices"]]
        send({"ev": "built", "batch": job["batch"]})
        t0 = time.perf_counter()
        try:
            v = audit_in_process(run_dir, cfg=FUZZ_CFG, out_dir=work / "out")
        except BaseException as e:  # noqa: BLE001 - reported, the parent isolates the file
            send({"ev": "raised", "batch": job["batch"], "error_type": type(e).__name__,
                  "traceback": traceback.format_exc()[-4000:]})
            shutil.rmtree(work, ignore_errors=True)
            continue
        wall = time.perf_counter() - t0
        by_unit = {u["unit"]: u for u in v["units"]}
        results = []
        for info in infos:
            r = judge(info, by_unit.get(info["unit"]))
            r["seconds"] = round(times.get(info["unit"], 0.0), 4)
            results.append(r)
        extra = sorted(set(by_unit) - {x["unit"] for x in infos})
        shutil.rmtree(work, ignore_errors=True)
        send({"ev": "done", "batch": job["batch"], "results": results, "wall_s": wall, "extra_units": extra,
              "maxrss_kib": _maxrss_kib(), "children_maxrss_kib": _maxrss_kib(resource.RUSAGE_CHILDREN)})
    return 0


# =============================================================== parent

class Worker:
    def __init__(self, k: int, args, seeds_dir: Path, tmp_root: Path, log_dir: Path) -> None:
        self.k = k
        self.args = args
        self.seeds_dir, self.tmp_root, self.log_dir = seeds_dir, tmp_root, log_dir
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0
        self.peak_self_kib = 0
        self.peak_children_kib = 0
        self.start()

    def start(self) -> None:
        self.starts += 1
        err = open(self.log_dir / f"worker{self.k}.{self.starts}.stderr", "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        env.pop("CKPTAUDIT_RAISE_AUDIT_ERRORS", None)
        self.proc = subprocess.Popen([C.PYTHON, __file__, "--worker", "--seeds-dir", str(self.seeds_dir),
                                      "--seed", str(self.args.seed), "--tmp", str(self.tmp_root)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                     start_new_session=True, env=env, cwd=str(self.tmp_root))
        err.close()
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buf = b""
        self.ready = False
        self.job: Optional[dict] = None
        self.guard: Optional[Tuple[str, str, float]] = None
        self.accum: Dict[str, float] = collections.defaultdict(float)
        self.last_event = time.monotonic()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and its load-test children
            except ProcessLookupError:
                pass
        if self.proc:
            self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def submit(self, job: dict) -> None:
        self.job = job
        self.guard = None
        self.accum.clear()
        self.last_event = time.monotonic()
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def messages(self) -> List[dict]:
        out = []
        try:
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
        except BlockingIOError:
            return out
        if not chunk:
            return [{"ev": "eof"}]
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for ln in lines:
            if ln.strip():
                out.append(json.loads(ln))
        return out


def _plan(n: int, fmts: Sequence[str], batch_override: Optional[int]) -> List[dict]:
    by_fmt: Dict[str, List[int]] = collections.defaultdict(list)
    for i in range(n):
        by_fmt[format_of(i)].append(i)
    batches = []
    for fmt in FORMATS:
        if fmt not in fmts:
            continue
        idx = by_fmt[fmt]
        size = batch_override or BATCH[fmt]
        for a in range(0, len(idx), size):
            batches.append({"fmt": fmt, "indices": idx[a:a + size]})
    # interleave formats so both workers see every kind of run
    batches.sort(key=lambda b: (b["indices"][0] // (7 * 100), FORMATS.index(b["fmt"])))
    for k, b in enumerate(batches):
        b["batch"] = k
    return batches


def run(args) -> dict:
    t_start = time.perf_counter()
    tmp_root = Path(tempfile.mkdtemp(prefix="ckptaudit-fuzz-", dir=args.tmp))
    log_dir = tmp_root / "logs"
    log_dir.mkdir()
    repro = Path(args.repro) if args.repro else Path(tempfile.gettempdir()) / f"ckptaudit-fuzz-repro-{args.seed}"
    if repro.exists():
        shutil.rmtree(repro)
    if args.seeds_dir:
        seeds_dir = Path(args.seeds_dir)
        seeds = load_seeds(seeds_dir)
    else:
        seeds_dir = tmp_root / "seeds"
        t = time.perf_counter()
        seeds = build_seeds_in_child(seeds_dir)
        print(f"# seeds built in {time.perf_counter() - t:.1f} s: " +
              ", ".join(f"{f} {len(s)}" for f, s in seeds.items()), file=sys.stderr)
    fmts = [f for f in FORMATS if seeds.get(f)]
    queue = collections.deque(_plan(args.n, fmts, args.batch))
    next_batch = len(queue)
    results: Dict[int, dict] = {}
    problems: List[dict] = []
    extra_units = 0
    batch_walls: List[float] = []
    workers = [Worker(k, args, seeds_dir, tmp_root, log_dir) for k in range(args.workers)]
    sel = selectors.DefaultSelector()
    for w in workers:
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
    total_jobs = len(queue)
    done_jobs = 0
    last_print = time.monotonic()

    def requeue(indices: List[int], fmt: str) -> None:
        nonlocal next_batch
        if indices:
            queue.appendleft({"fmt": fmt, "indices": indices, "batch": next_batch})
            next_batch += 1

    def split(w: Worker, why: str, detail: str) -> None:
        job = w.job
        idx = job["indices"]
        if len(idx) == 1:
            problems.append({"i": idx[0], "fmt": job["fmt"], "kind": why, "detail": detail[-3000:]})
        else:
            h = len(idx) // 2
            requeue(idx[h:], job["fmt"])
            requeue(idx[:h], job["fmt"])

    def restart(w: Worker) -> None:
        sel.unregister(w.proc.stdout)
        w.restart()
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)

    def unit_index(job: dict, unit: str) -> Optional[int]:
        top = unit.split("/", 1)[0]
        for i in job["indices"]:
            if top in (UNIT_NAMES[job["fmt"]].format(i=i), f"shards-{i}"):
                return i
        return None

    try:
        while queue or any(w.job for w in workers):
            for w in workers:
                if w.ready and w.job is None and queue:
                    w.submit(queue.popleft())
            for key, _ in sel.select(timeout=0.25):
                w: Worker = key.data
                for msg in w.messages():
                    ev = msg["ev"]
                    w.last_event = time.monotonic()
                    if ev == "ready":
                        w.ready = True
                        w.peak_self_kib = max(w.peak_self_kib, msg["maxrss_kib"])
                    elif ev == "start":
                        w.guard = (msg["unit"], msg["stage"], time.monotonic())
                    elif ev == "end":
                        w.guard = None
                        w.accum[msg["unit"]] += msg["s"]
                        if "rss_jump_kib" in msg:
                            i = unit_index(w.job, msg["unit"])
                            problems.append({"i": i, "fmt": w.job["fmt"], "kind": "rss_jump",
                                             "detail": f"{msg['stage']}: ru_maxrss {msg['rss_jump_kib']} KiB"})
                    elif ev == "raised":
                        split(w, "raised", f"{msg['error_type']}\n{msg['traceback']}")
                        w.job = None
                    elif ev == "done":
                        for r in msg["results"]:
                            results[r["i"]] = r
                        batch_walls.append(msg["wall_s"])
                        w.peak_self_kib = max(w.peak_self_kib, msg["maxrss_kib"])
                        w.peak_children_kib = max(w.peak_children_kib, msg["children_maxrss_kib"])
                        extra_units += len(msg["extra_units"])  # e.g. shards of a broken index: own units
                        w.job = None
                        done_jobs += 1
                    elif ev == "eof":
                        rc = w.proc.wait()
                        job = w.job
                        if job is not None:
                            split(w, "worker_died", f"exit status {rc}; see {log_dir}/worker{w.k}.{w.starts}.stderr")
                        restart(w)
                        break
            now = time.monotonic()
            for w in workers:
                if w.job is None:
                    continue
                if w.guard is not None:
                    unit, stage, t0 = w.guard
                    spent = w.accum[unit] + (now - t0)
                    if spent > args.timeout:
                        i = unit_index(w.job, unit)
                        problems.append({"i": i, "fmt": w.job["fmt"], "kind": "hang",
                                         "detail": f"{unit}: over {args.timeout} s (in stage {stage})"})
                        rest = [x for x in w.job["indices"] if x != i]
                        fmt = w.job["fmt"]
                        w.job = None
                        restart(w)
                        requeue(rest, fmt)
                else:
                    gap_limit = args.timeout if len(w.job["indices"]) == 1 else 3 * args.timeout + 0.2 * len(
                        w.job["indices"])
                    if now - w.last_event > gap_limit:
                        split(w, "hang", f"run-level work (inventory/report) silent for over {gap_limit:.0f} s")
                        w.job = None
                        restart(w)
            if now - last_print > 30:
                last_print = now
                print(f"# {len(results)} files examined, {len(problems)} problems, "
                      f"{time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    finally:
        for w in workers:
            w.kill()
    wall = time.perf_counter() - t_start
    summary = summarise(args, results, problems, workers, wall, batch_walls, seeds)
    summary["other_units_in_verdicts"] = extra_units
    _write_repros(repro, problems, results, seeds, args.seed)
    if repro.exists() and not args.seeds_dir:  # seeds are rebuilt per run (DCP and legacy bytes differ): keep them
        shutil.copytree(seeds_dir, repro / "seeds")
    summary["repro_dir"] = str(repro) if repro.exists() else ""
    if not args.keep_tmp:
        shutil.rmtree(tmp_root, ignore_errors=True)
    return summary


def _write_repros(repro: Path, problems: List[dict], results: Dict[int, dict], seeds, master_seed: int) -> None:
    bad = {p["i"]: p for p in problems if p.get("i") is not None}
    for r in results.values():
        if r.get("audit_errors") or r.get("false_ok") or r.get("missing"):
            bad.setdefault(r["i"], {"i": r["i"], "fmt": r["fmt"],
                                    "kind": "audit_error" if r.get("audit_errors") else
                                    ("false_ok" if r.get("false_ok") else "missing"),
                                    "detail": json.dumps(r.get("audit_errors") or r.get("usable_for"))})
    for i, p in sorted(bad.items())[:200]:
        d = repro / f"{p['kind']}_{i:06d}"
        (d / "run").mkdir(parents=True, exist_ok=True)
        info = make_unit(d / "run", i, seeds, master_seed, p["fmt"])
        (d / "what.json").write_text(json.dumps({**p, **info}, indent=1) + "\n")


def summarise(args, results: Dict[int, dict], problems: List[dict], workers: List[Worker], wall: float,
              batch_walls: List[float], seeds) -> dict:
    per: Dict[str, dict] = {}
    for fmt in FORMATS:
        rs = [r for r in results.values() if r["fmt"] == fmt]
        pr = [p for p in problems if p["fmt"] == fmt]
        kinds = collections.Counter(k for r in rs for k in r["kinds"])
        secs = sorted(r["seconds"] for r in rs)
        prot = [r for r in rs if r["sidecar"] and r["differs"]]
        per[fmt] = {
            "files": len(rs) + len({p["i"] for p in pr if p["kind"] in ("hang", "raised", "worker_died")}),
            "seeds": [s["name"] for s in seeds.get(fmt, [])],
            "audit_error_files": sum(1 for r in rs if r["audit_errors"]),
            "raised": sum(1 for p in pr if p["kind"] == "raised"),
            "worker_died": sum(1 for p in pr if p["kind"] == "worker_died"),
            "hangs": sum(1 for p in pr if p["kind"] == "hang"),
            "missing_units": sum(1 for r in rs if r["missing"]),
            "with_sidecar_and_changed": len(prot),
            "checksum_mismatch_seen": sum(1 for r in prot if r["checksum_mismatch"]),
            "false_ok": sum(1 for r in rs if r["false_ok"]),
            "usable_with_changed_sidecar": dict(collections.Counter(r["usable_for"] for r in prot)),
            "usable_for": dict(collections.Counter(str(r["usable_for"]) for r in rs)),
            "unchanged_by_mutation": sum(1 for r in rs if not r["differs"]),
            "seconds_median": secs[len(secs) // 2] if secs else None,
            "seconds_p99": secs[int(len(secs) * 0.99)] if secs else None,
            "seconds_max": secs[-1] if secs else None,
            "top_kinds": kinds.most_common(10),
        }
    uncaught = sum(p["audit_error_files"] + p["raised"] + p["worker_died"] for p in per.values())
    hangs = sum(p["hangs"] for p in per.values())
    peak_self = max(w.peak_self_kib for w in workers) / 1024
    peak_children = max(w.peak_children_kib for w in workers) / 1024
    false_ok = sum(p["false_ok"] for p in per.values())
    missing = sum(p["missing_units"] for p in per.values())
    errors = [{"i": r["i"], "fmt": r["fmt"], "unit": r["unit"], "seed": r["seed"], "mutations": r["mutations"],
               "audit_errors": r["audit_errors"]} for r in results.values() if r["audit_errors"]]
    return {
        "command": " ".join([os.path.relpath(C.PYTHON), *sys.argv]),
        "machine": C.machine_line(),
        "n_requested": args.n, "seed": args.seed, "workers": args.workers, "timeout_s": args.timeout,
        "files": sum(p["files"] for p in per.values()),
        "uncaught_exceptions": uncaught, "hangs": hangs, "false_ok": false_ok,
        "false_ok_strict": sum(1 for r in results.values() if r["false_ok_strict"]),
        "missing_units": missing,
        "peak_worker_rss_mib": round(peak_self, 1), "peak_load_child_rss_mib": round(peak_children, 1),
        "worker_starts": sum(w.starts for w in workers),
        "wall_s": round(wall, 1),
        "batch_audit_s_median": round(C.median(batch_walls), 2) if batch_walls else None,
        "per_format": per,
        "problems": problems[:500],
        "audit_error_files": errors[:200],
        "pass": uncaught == 0 and hangs == 0 and false_ok == 0 and missing == 0 and peak_self <= RSS_LIMIT_MIB,
    }


def print_summary(s: dict) -> None:
    print(f"\nMachine: {s['machine']}\n")
    print(f"Command: `{s['command']}`; {s['workers']} workers, per-file timeout {s['timeout_s']} s, "
          f"wall {s['wall_s']:.0f} s (median audit of one run folder {s['batch_audit_s_median']} s).\n")
    rows = []
    for fmt, p in s["per_format"].items():
        rows.append([fmt, p["files"], p["audit_error_files"] + p["raised"] + p["worker_died"], p["hangs"],
                     p["missing_units"], p["with_sidecar_and_changed"], p["checksum_mismatch_seen"], p["false_ok"],
                     json.dumps(p["usable_with_changed_sidecar"], sort_keys=True).replace('"', ""),
                     f"{p['seconds_median']:.3f}" if p["seconds_median"] is not None else "-",
                     f"{p['seconds_max']:.2f}" if p["seconds_max"] is not None else "-"])
    rows.append(["**all**", s["files"], s["uncaught_exceptions"], s["hangs"], s["missing_units"],
                 sum(p["with_sidecar_and_changed"] for p in s["per_format"].values()),
                 sum(p["checksum_mismatch_seen"] for p in s["per_format"].values()), s["false_ok"], "", "", ""])
    print(C.md_table(["format", "files", "uncaught exceptions", f"hangs (>{s['timeout_s']:g} s)", "units missing", "changed, sidecar kept",
                      "checksum_mismatch", "false ok", "usable_for of those", "median s/file", "max s/file"], rows))
    print(f"\nPeak RSS: workers {s['peak_worker_rss_mib']:.0f} MiB (limit {RSS_LIMIT_MIB}), load-test children "
          f"{s['peak_load_child_rss_mib']:.0f} MiB; worker starts {s['worker_starts']}; strict false ok (any use "
          f"left, training-state files included) {s['false_ok_strict']}.\n")
    rows = [[fmt, ", ".join(f"{k} {n}" for k, n in p["top_kinds"])] for fmt, p in s["per_format"].items()]
    print(C.md_table(["format", "top 10 finding kinds (files)"], rows))
    if s["problems"] or s["audit_error_files"]:
        print("\nProblems:")
        for p in s["problems"][:30]:
            print(f"- {p['kind']} file {p['i']} ({p['fmt']}): {p['detail'].splitlines()[-1][:300] if p['detail'] else ''}")
        for e in s["audit_error_files"][:30]:
            print(f"- audit_error file {e['i']} ({e['fmt']}, seed {e['seed']}, {e['mutations']}): {e['audit_errors'][:2]}")
        if s.get("repro_dir"):
            print(f"\nReproducers: {s['repro_dir']}")
    print(f"\nPASS: {s['pass']}")


def show(a) -> int:
    """Rebuild one mutated file and audit it alone, raising the real traceback of an ``audit_error``."""
    seeds_dir = Path(a.seeds_dir) if a.seeds_dir else Path(tempfile.mkdtemp(prefix="ckptaudit-fuzz-seeds-"))
    seeds = load_seeds(seeds_dir) if a.seeds_dir else build_seeds_in_child(seeds_dir)
    d = Path(a.repro or tempfile.mkdtemp(prefix="ckptaudit-fuzz-show-"))
    run_dir = d / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    info = make_unit(run_dir, a.show, seeds, a.seed)
    print(json.dumps(info, indent=1))
    os.environ["CKPTAUDIT_RAISE_AUDIT_ERRORS"] = "1"
    from ckptaudit.pipeline import audit_in_process

    t = time.perf_counter()
    v = audit_in_process(run_dir, cfg=FUZZ_CFG, out_dir=d / "out")
    for u in v["units"]:
        print(u["unit"], u["usable_for"], sorted({f["kind"] for f in u["findings"]}))
    print(f"{time.perf_counter() - t:.2f} s; run folder {run_dir}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000, help="mutated files (spread evenly over the formats)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--quick", action="store_true", help="350 files (50 per format), batches of 25")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per file before it is a hang")
    ap.add_argument("--batch", type=int, default=None, help="units per run folder (default: per format)")
    ap.add_argument("--seeds-dir", help="use these seeds (a folder with seeds.json) instead of building them")
    ap.add_argument("--repro", help="folder for rebuilt problem files (default /tmp/ckptaudit-fuzz-repro-SEED)")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--keep-tmp", action="store_true")
    ap.add_argument("--write-test-seeds", metavar="DIR", help="build the small committed seeds into DIR and exit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--show", type=int, metavar="I", help="rebuild file I (with --seed, --seeds-dir), print what "
                    "was done and audit it alone with CKPTAUDIT_RAISE_AUDIT_ERRORS=1")
    a = ap.parse_args(argv)
    if a.show is not None:
        return show(a)
    if a.worker:
        return worker_main(a.seeds_dir, a.seed, a.tmp)
    if a.write_test_seeds:
        doc = build_seeds_in_child(Path(a.write_test_seeds), small=True)
        total = sum(p.stat().st_size for p in Path(a.write_test_seeds).rglob("*") if p.is_file())
        print(f"{sum(len(v) for v in doc.values())} seeds, {total} bytes in {a.write_test_seeds}")
        return 0
    if a.quick:
        a.n = min(a.n, 350)
        a.batch = a.batch or 25
    s = run(a)
    print_summary(s)
    if a.out:
        Path(a.out).write_text(json.dumps(s, indent=1, default=str) + "\n")
    return 0 if s["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
