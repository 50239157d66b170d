"""Put a sample into the files a training run really holds.

Five containers, each a run folder with one clean, older checkpoint beside
the malicious one (the layout of the frameworks that write them):

``torchzip``   ``ckpt_000050.pt`` (clean) and ``ckpt_000100.pt``: a ``torch.save`` zip of a
               tiny real training state whose ``ckpt_000100/data.pkl`` is the sample.  The zip
               is rewritten with :mod:`zipfile` keeping torch's record names and order
               (``<name>/data.pkl``, ``.format_version``, ``.storage_alignment``, ``byteorder``,
               ``data/0``…, ``version``, ``.data/serialization_id``), STORED, records aligned to
               64 bytes with torch's ``FB`` padding field.
``legacy``     the same two names, written with ``_use_new_zipfile_serialization=False``; the
               sample replaces record ``sample.legacy_slot`` of the five pickles (0 magic
               number, 1 protocol version, 2 sys info, 3 object, 4 storage keys).
``raw``        ``ckpt_000100.pt`` is the sample's bytes alone (a plain pickle under a checkpoint
               name); ``ckpt_000050.pt`` is a clean ``torch.save`` zip.
``dcp``        ``step-50/`` and ``step-100/`` saved by ``torch.distributed.checkpoint.save`` in one
               process (``no_dist=True``); ``step-100/.metadata`` is the sample, next to the real
               ``__0_0.distcp``.
``hf_trainer`` ``checkpoint-10/`` and ``checkpoint-20/`` with the files transformers 5.24's Trainer
               writes (config.json, generation_config.json, model.safetensors, optimizer.pt,
               scheduler.pt, rng_state.pth, trainer_state.json, training_args.bin);
               ``checkpoint-20/training_args.bin`` is a ``torch.save`` zip whose
               ``training_args/data.pkl`` is the sample.

Three more zip containers apply the archive-level scanner bypasses to a few
samples (:data:`ZIP_TRICK_SAMPLES`): ``torchzip_crc`` (CVE-2025-10156: wrong
CRC-32 of ``data.pkl``), ``torchzip_flagbits`` (CVE-2025-1945: general-purpose
flag bit 0x1 set on ``data.pkl``), ``torchzip_localname`` (CVE-2025-1944: the
local header names ``datap.kl`` while the central directory says ``data.pkl``).

Everything is deterministic: fixed seeds, fixed zip times, DCP's random
``save_id`` and absolute ``checkpoint_id`` replaced by fixed values.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickletools
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from .samples import Sample

CONTAINERS = ("torchzip", "legacy", "raw", "dcp", "hf_trainer")
ZIP_TRICKS = ("torchzip_crc", "torchzip_flagbits", "torchzip_localname")
ALL_CONTAINERS = CONTAINERS + ZIP_TRICKS
#: Samples that also go into the zip-trick containers.
ZIP_TRICK_SAMPLES = ("posix_system_p2", "builtins_exec_p4", "nested_pickle_loads_bytes_p3")

LEGACY_RECORDS = ("magic-number pickle", "protocol-version pickle", "sys-info pickle", "object pickle",
                  "storage-key pickle")
DCP_SAVE_ID = "00000000-0000-4000-8000-00000000c0de"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)
#: ``pickle.dumps([], protocol=2)``: the storage-key record of a legacy file without storages.
EMPTY_KEY_LIST = b"\x80\x02]q\x00."

DESCRIPTIONS = {
    "torchzip": "torch.save zip; <name>/data.pkl is the sample",
    "legacy": "legacy torch.save file; one of its five pickle records is the sample",
    "raw": "the sample alone, as a raw pickle file named like a checkpoint",
    "dcp": "torch.distributed.checkpoint folder; .metadata is the sample",
    "hf_trainer": "HF Trainer checkpoint-N folder; training_args.bin's data.pkl is the sample",
    "torchzip_crc": "torchzip with a wrong CRC-32 for data.pkl (CVE-2025-10156)",
    "torchzip_flagbits": "torchzip with flag bit 0x1 set on data.pkl (CVE-2025-1945)",
    "torchzip_localname": "torchzip whose local header names data.pkl differently from the central directory "
                          "(CVE-2025-1944)",
}


# ------------------------------------------------------------------ zip helpers


def _zip_records(data: bytes) -> List[Tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def write_torch_zip(records: List[Tuple[str, bytes]]) -> bytes:
    """A zip with torch's record order, STORED, each record's data aligned to 64 bytes.

    Alignment uses torch's own padding extra field (id ``FB``, ``Z`` bytes;
    caffe2 ``PyTorchStreamWriter``), so the layout matches what ``torch.save``
    writes except for the data descriptors, which :mod:`zipfile` does not need.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, payload in records:
            zi = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            zi.compress_type = zipfile.ZIP_STORED
            zi.create_system = 0
            zi.external_attr = 0
            base = buf.tell() + 30 + len(name.encode()) + 4
            pad = (-base) % 64
            zi.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            z.writestr(zi, payload)
    return buf.getvalue()


def replace_data_pkl(zip_bytes: bytes, new_pkl: bytes) -> bytes:
    recs = _zip_records(zip_bytes)
    out = [(n, new_pkl if n.endswith("/data.pkl") and n.count("/") == 1 else b) for n, b in recs]
    assert any(n.endswith("/data.pkl") for n, _ in recs), "no data.pkl record"
    return write_torch_zip(out)


def _central_entries(data: bytes):
    eocd = data.rfind(b"PK\x05\x06")
    n = struct.unpack_from("<H", data, eocd + 10)[0]
    off = struct.unpack_from("<I", data, eocd + 16)[0]
    for _ in range(n):
        nlen, xlen, clen = struct.unpack_from("<HHH", data, off + 28)
        name = data[off + 46: off + 46 + nlen].decode()
        lho = struct.unpack_from("<I", data, off + 42)[0]
        yield off, lho, name
        off += 46 + nlen + xlen + clen


def apply_zip_trick(data: bytes, trick: str) -> bytes:
    """Patch the ``data.pkl`` entry of a torch zip the way the advisories describe."""
    b = bytearray(data)
    for cd, lho, name in list(_central_entries(data)):
        if not (name.endswith("/data.pkl") and name.count("/") == 1):
            continue
        if trick == "torchzip_crc":  # CVE-2025-10156
            crc = struct.unpack_from("<I", b, cd + 16)[0] ^ 0xFFFFFFFF
            struct.pack_into("<I", b, cd + 16, crc)
            struct.pack_into("<I", b, lho + 14, crc)
        elif trick == "torchzip_flagbits":  # CVE-2025-1945
            struct.pack_into("<H", b, cd + 8, struct.unpack_from("<H", b, cd + 8)[0] | 0x1)
            struct.pack_into("<H", b, lho + 6, struct.unpack_from("<H", b, lho + 6)[0] | 0x1)
        elif trick == "torchzip_localname":  # CVE-2025-1944
            nlen = struct.unpack_from("<H", b, lho + 26)[0]
            local = bytes(b[lho + 30: lho + 30 + nlen])
            assert local == name.encode()
            b[lho + 30: lho + 30 + nlen] = local[: -len("data.pkl")] + b"datap.kl"
        else:
            raise ValueError(trick)
    return bytes(b)


# ------------------------------------------------------------------ legacy helpers


def legacy_records(data: bytes) -> Tuple[List[bytes], bytes]:
    """The five pickles of a legacy torch.save file and the raw storage bytes after them."""
    f = io.BytesIO(data)
    recs = []
    for _ in range(5):
        start = f.tell()
        for op, _arg, pos in pickletools.genops(f):
            if op.name == "STOP":
                break
        recs.append(data[start:f.tell()])
    return recs, data[f.tell():]


def stable_legacy(data: bytes) -> bytes:
    """The same legacy file with deterministic storage keys.

    ``_legacy_save`` names each storage ``str(storage._cdata)``, a memory
    address, and writes the key list and the raw storages in the sorted order
    of those names.  Keys are renamed ``"0"``, ``"1"``... in order of first
    use in the object pickle; the key-list pickle is rewritten as torch
    writes it (``pickle.dump(sorted keys, protocol=2)`` of a list of str) and
    the raw storages (8-byte element count, then the elements) are put in
    that order.  Every storage of the templates is float32 (asserted).
    """
    import pickle  # only to *write* a list of str, as torch does; nothing is unpickled

    recs, tail = legacy_records(data)
    old_keys = [arg for op, arg, _ in pickletools.genops(recs[4]) if op.name in ("BINUNICODE", "SHORT_BINUNICODE")]
    segs, pos = {}, 0
    for k in old_keys:
        (n,) = struct.unpack_from("<q", tail, pos)
        segs[k] = tail[pos: pos + 8 + 4 * n]
        pos += 8 + 4 * n
    assert pos == len(tail), "legacy template with a storage that is not float32"
    used = [arg for op, arg, _ in pickletools.genops(recs[3]) if op.name == "BINUNICODE" and arg in segs]
    order = list(dict.fromkeys(used))
    assert sorted(order) == sorted(old_keys)
    rename = {k: str(i) for i, k in enumerate(order)}
    for k, new in rename.items():
        old_op = b"X" + struct.pack("<I", len(k)) + k.encode()
        assert recs[3].count(old_op) >= 1
        recs[3] = recs[3].replace(old_op, b"X" + struct.pack("<I", len(new)) + new.encode())
    new_keys = sorted(rename.values())
    back = {v: k for k, v in rename.items()}
    recs[4] = pickle.dumps(new_keys, protocol=2)
    return b"".join(recs) + b"".join(segs[back[k]] for k in new_keys)


# ------------------------------------------------------------------ templates


class Templates:
    """The clean files every run folder is made of, built once per corpus."""

    def __init__(self, real_training_args: bool = True) -> None:
        import torch  # noqa: F401  (the templates are torch.save / DCP output)

        self.tmp = tempfile.TemporaryDirectory(prefix="ckptaudit-corpus-")
        self.dir = Path(self.tmp.name)
        self.real_training_args = real_training_args
        self.training_args_kind = ""
        self._cache: Dict[str, object] = {}

    def close(self) -> None:
        self.tmp.cleanup()

    def _memo(self, key: str, fn: Callable[[], object]):
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    # -- a tiny real training state (model + AdamW after one step)
    def state(self, step: int) -> dict:
        def make():
            import torch

            g = torch.Generator().manual_seed(1000 + step)
            model = torch.nn.Linear(4, 2)
            with torch.no_grad():
                model.weight.copy_(torch.randn(2, 4, generator=g))
                model.bias.copy_(torch.randn(2, generator=g))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            model(torch.ones(3, 4)).sum().backward()
            opt.step()
            return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "epoch": 0}

        return self._memo(f"state{step}", make)

    def torch_save(self, obj, name: str, legacy: bool = False) -> bytes:
        import torch

        p = self.dir / name
        if legacy:
            torch.save(obj, p, _use_new_zipfile_serialization=False)
        else:
            torch.save(obj, p)
        data = p.read_bytes()
        p.unlink()
        return data

    def ckpt_zip(self, step: int) -> bytes:
        return self._memo(f"zip{step}", lambda: self.torch_save(self.state(step), f"ckpt_{step:06d}.pt"))

    def ckpt_legacy(self, step: int) -> bytes:
        return self._memo(f"legacy{step}",
                          lambda: stable_legacy(self.torch_save(self.state(step), f"ckpt_{step:06d}.pt", legacy=True)))

    # -- DCP
    def dcp(self, step: int) -> Dict[str, bytes]:
        def make():
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.filesystem import FileSystemWriter
            from torch.distributed.checkpoint.metadata import StorageMeta

            name = f"step-{step}"

            class _Writer(FileSystemWriter):
                # fixed save_id and a relative checkpoint_id, so .metadata does not depend on the
                # machine or time (FileSystemWriter pickles both into it)
                def reset(self, checkpoint_id=None):
                    super().reset(checkpoint_id)
                    self.save_id = DCP_SAVE_ID

                def storage_meta(self):
                    return StorageMeta(checkpoint_id=Path(name), save_id=DCP_SAVE_ID)

            st = self.state(step)
            d = self.dir / name
            w = _Writer(str(d))
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
                dcp.save({"model": st["model"], "step": step}, storage_writer=w, no_dist=True)
            files = {p.name: p.read_bytes() for p in sorted(d.iterdir())}
            for p in d.iterdir():
                p.unlink()
            d.rmdir()
            return files

        return self._memo(f"dcp{step}", make)

    # -- HF Trainer checkpoint-N
    def training_args(self) -> bytes:
        def make():
            obj = None
            if self.real_training_args:
                try:
                    import warnings

                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        import transformers
                        from transformers import TrainingArguments

                        obj = TrainingArguments(output_dir="out", max_steps=20, save_steps=10, logging_steps=1,
                                                per_device_train_batch_size=2, report_to=[], use_cpu=True,
                                                seed=42)
                    self.training_args_kind = f"transformers {transformers.__version__} TrainingArguments"
                except Exception as e:  # transformers missing or broken: a plain stand-in
                    self.training_args_kind = f"dict stand-in (TrainingArguments unavailable: {type(e).__name__})"
            else:
                self.training_args_kind = "dict stand-in (--no-transformers)"
            if obj is None:
                obj = {"output_dir": "out", "max_steps": 20, "save_steps": 10, "seed": 42}
            return self.torch_save(obj, "training_args.bin")

        return self._memo("training_args", make)

    def hf_checkpoint(self, step: int) -> Dict[str, bytes]:
        def make():
            import random

            import numpy as np
            import torch
            from safetensors.torch import save as st_save

            g = torch.Generator().manual_seed(2000 + step)
            shapes = [
                ("transformer.h.0.attn.c_attn.bias", (24,)), ("transformer.h.0.attn.c_attn.weight", (8, 24)),
                ("transformer.h.0.attn.c_proj.bias", (8,)), ("transformer.h.0.attn.c_proj.weight", (8, 8)),
                ("transformer.h.0.ln_1.bias", (8,)), ("transformer.h.0.ln_1.weight", (8,)),
                ("transformer.h.0.ln_2.bias", (8,)), ("transformer.h.0.ln_2.weight", (8,)),
                ("transformer.h.0.mlp.c_fc.bias", (32,)), ("transformer.h.0.mlp.c_fc.weight", (8, 32)),
                ("transformer.h.0.mlp.c_proj.bias", (8,)), ("transformer.h.0.mlp.c_proj.weight", (32, 8)),
                ("transformer.ln_f.bias", (8,)), ("transformer.ln_f.weight", (8,)),
                ("transformer.wpe.weight", (8, 8)), ("transformer.wte.weight", (16, 8)),
            ]
            tensors = {n: torch.randn(*s, generator=g) * 0.02 for n, s in shapes}
            params = [torch.nn.Parameter(t.clone()) for t in tensors.values()]
            opt = torch.optim.AdamW(params, lr=5e-5)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 20)
            for p in params:
                p.grad = torch.ones_like(p)
            opt.step()
            for _ in range(step):
                sched.step()
            rng = {"python": random.Random(42 + step).getstate(),
                   "numpy": np.random.RandomState(42 + step).get_state(),
                   "cpu": torch.Generator().manual_seed(42 + step).get_state()}
            config = {
                "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
                "bos_token_id": 0, "dtype": "float32", "embd_pdrop": 0.1, "eos_token_id": 0,
                "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_embd": 8,
                "n_head": 2, "n_inner": None, "n_layer": 1, "n_positions": 8, "resid_pdrop": 0.1,
                "tie_word_embeddings": True, "transformers_version": "5.24.0", "use_cache": False, "vocab_size": 16,
            }
            gen = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 0,
                   "transformers_version": "5.24.0", "use_cache": True}
            state = {
                "best_global_step": None, "best_metric": None, "best_model_checkpoint": None,
                "epoch": step / 40, "eval_steps": 500, "global_step": step, "is_hyper_param_search": False,
                "is_local_process_zero": True, "is_world_process_zero": True,
                "log_history": [{"epoch": s / 40, "grad_norm": 2.0, "learning_rate": 5e-05 * (1 - s / 20),
                                 "loss": 2.05, "step": s} for s in range(1, step + 1)],
                "logging_steps": 1, "max_steps": 20, "num_input_tokens_seen": 0, "num_train_epochs": 1,
                "save_steps": 10, "stateful_callbacks": {"TrainerControl": {"args": {
                    "should_epoch_stop": False, "should_evaluate": False, "should_log": False, "should_save": True,
                    "should_training_stop": False}, "attributes": {}}},
                "total_flos": 42624.0 * step, "train_batch_size": 2, "trial_name": None, "trial_params": None,
            }
            return {
                "config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
                "generation_config.json": (json.dumps(gen, indent=2, sort_keys=True) + "\n").encode(),
                "model.safetensors": st_save(tensors, metadata={"format": "pt"}),
                "optimizer.pt": self.torch_save(opt.state_dict(), "optimizer.pt"),
                "scheduler.pt": self.torch_save(sched.state_dict(), "scheduler.pt"),
                "rng_state.pth": self.torch_save(rng, "rng_state.pth"),
                "trainer_state.json": (json.dumps(state, indent=2, sort_keys=True) + "\n").encode(),
                "training_args.bin": self.training_args(),
            }

        return self._memo(f"hf{step}", make)


# ------------------------------------------------------------------ one run folder per sample x container


def _write(root: Path, files: Dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def build_run(t: Templates, s: Sample, container: str, run_dir: Path) -> dict:
    """Write ``run_dir`` for sample ``s`` in ``container``; return the truth record."""
    data = s.bytes()
    truth = {"sample": s.id, "container": container, "family": s.family, "protocol": s.protocol,
             "source": s.source, "malicious": s.family != "control"}
    if container in ("torchzip",) + ZIP_TRICKS:
        mal = replace_data_pkl(t.ckpt_zip(100), data)
        if container != "torchzip":
            mal = apply_zip_trick(mal, container)
        files = {"ckpt_000050.pt": t.ckpt_zip(50), "ckpt_000100.pt": mal}
        truth.update(unit="ckpt_000100.pt", file="ckpt_000100.pt", member="ckpt_000100/data.pkl",
                     clean_units=["ckpt_000050.pt"],
                     runs_it="torch.load(path, weights_only=False) unpickles data.pkl")
    elif container == "legacy":
        recs, tail = legacy_records(t.ckpt_legacy(100))
        recs[s.legacy_slot] = data
        if s.legacy_slot == 3:  # the object pickle names no storage now: empty key list, no storages
            recs[4], tail = EMPTY_KEY_LIST, b""
        files = {"ckpt_000050.pt": t.ckpt_legacy(50), "ckpt_000100.pt": b"".join(recs) + tail}
        truth.update(unit="ckpt_000100.pt", file="ckpt_000100.pt",
                     member=f"legacy record {s.legacy_slot + 1} of 5 ({LEGACY_RECORDS[s.legacy_slot]})",
                     legacy_slot=s.legacy_slot, clean_units=["ckpt_000050.pt"],
                     runs_it="torch.load(path, weights_only=False) unpickles records 1-5 in order (_legacy_load)")
    elif container == "raw":
        files = {"ckpt_000050.pt": t.ckpt_zip(50), "ckpt_000100.pt": data}
        truth.update(unit="ckpt_000100.pt", file="ckpt_000100.pt", member="(whole file)",
                     clean_units=["ckpt_000050.pt"],
                     runs_it="torch.load(path, weights_only=False) of a non-zip file unpickles its first pickle "
                             "(the 'magic number') before any check; pickle.load(f) likewise")
    elif container == "dcp":
        files = {f"step-50/{n}": b for n, b in t.dcp(50).items()}
        files.update({f"step-100/{n}": b for n, b in t.dcp(100).items()})
        files["step-100/.metadata"] = data
        truth.update(unit="step-100", file="step-100/.metadata", member=".metadata", clean_units=["step-50"],
                     runs_it="torch.distributed.checkpoint.load / FileSystemReader.read_metadata: pickle.load")
    elif container == "hf_trainer":
        files = {f"checkpoint-10/{n}": b for n, b in t.hf_checkpoint(10).items()}
        files.update({f"checkpoint-20/{n}": b for n, b in t.hf_checkpoint(20).items()})
        files["checkpoint-20/training_args.bin"] = replace_data_pkl(t.training_args(), data)
        truth.update(unit="checkpoint-20", file="checkpoint-20/training_args.bin", member="training_args/data.pkl",
                     clean_units=["checkpoint-10"],
                     runs_it="torch.load('training_args.bin', weights_only=False), as scripts that inspect or "
                             "reuse a run's arguments do (Trainer's resume itself does not unpickle it)")
    else:
        raise ValueError(container)
    _write(run_dir, files)
    truth["sha256"] = hashlib.sha256(files[truth["file"]]).hexdigest()
    truth["size_bytes"] = len(files[truth["file"]])
    (run_dir / "truth.json").write_text(json.dumps(truth, indent=2, sort_keys=True) + "\n")
    return truth


def runs_for(samples: List[Sample], containers=CONTAINERS, zip_tricks: bool = True) -> List[Tuple[Sample, str]]:
    """Every (sample, container) pair of the corpus, in a fixed order."""
    out = [(s, c) for s in samples for c in containers]
    if zip_tricks:
        out += [(s, c) for c in ZIP_TRICKS for s in samples if s.id in ZIP_TRICK_SAMPLES]
    return out


def run_name(sample_id: str, container: str) -> str:
    return f"{sample_id}__{container}"


__all__ = ["ALL_CONTAINERS", "CONTAINERS", "DESCRIPTIONS", "Templates", "ZIP_TRICKS", "ZIP_TRICK_SAMPLES",
           "build_run", "run_name", "runs_for", "write_torch_zip", "replace_data_pkl", "legacy_records",
           "apply_zip_trick"]
