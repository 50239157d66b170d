"""A real, tiny training run with a real crash: the bundled demo and a test fixture.

:func:`train` trains a nanoGPT-style character-level GPT (~105k parameters) on a
few KB of built-in public-domain text, on CPU, and every ``save_every`` steps
writes ``ckpt_{step:06d}.pt`` in nanoGPT's checkpoint schema (``model``,
``optimizer``, ``model_args``, ``iter_num``, ``best_val_loss``, ``config``; see
karpathy/nanoGPT ``train.py``) plus ``scheduler``, ``rng`` and ``loss``, and a
``sha256sum``-format sidecar ``ckpt_{step:06d}.pt.sha256``.  The writer is a
well-behaved one: bytes go to a temporary name, are fsynced, then ``os.replace``
puts them in place, and only then is the sidecar written.

:func:`make_demo_run` stages the incident on top of such a run:

1. the newest save (step ``max_steps``) is done by a forked child that writes
   ``torch.save`` output *directly to the final name* (a naive writer) and is
   killed with SIGKILL once ``truncate_fraction`` of the expected bytes are on
   disk: a genuinely truncated zip without a central directory and without a
   sidecar;
2. one older checkpoint gets one byte flipped in the middle of a tensor data
   record (``archive/data/<n>``), so ``torch.load`` still succeeds but the
   sidecar hash and the zip CRC-32 both disagree.

Everything is deterministic for a fixed seed: two runs give byte-identical
files.  This module imports torch at import time; import it lazily from CLIs.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import os
import random
import select
import signal
import struct
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

PathLike = Union[str, Path]

#: nanoGPT's checkpoint keys (karpathy/nanoGPT train.py), in its order.
NANOGPT_KEYS = ("model", "optimizer", "model_args", "iter_num", "best_val_loss", "config")
#: Keys this trainer adds to nanoGPT's schema.
EXTRA_KEYS = ("scheduler", "rng", "loss")

# Public-domain text (Shakespeare, Sonnets 18, 29, 73, 116, 130; 1609), ~3.2 KB.
TEXT = """\
Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.

When, in disgrace with fortune and men's eyes,
I all alone beweep my outcast state,
And trouble deaf heaven with my bootless cries,
And look upon myself and curse my fate,
Wishing me like to one more rich in hope,
Featured like him, like him with friends possess'd,
Desiring this man's art and that man's scope,
With what I most enjoy contented least;
Yet in these thoughts myself almost despising,
Haply I think on thee, and then my state,
Like to the lark at break of day arising
From sullen earth, sings hymns at heaven's gate;
For thy sweet love remember'd such wealth brings
That then I scorn to change my state with kings.

That time of year thou mayst in me behold
When yellow leaves, or none, or few, do hang
Upon those boughs which shake against the cold,
Bare ruin'd choirs, where late the sweet birds sang.
In me thou see'st the twilight of such day
As after sunset fadeth in the west,
Which by and by black night doth take away,
Death's second self, that seals up all in rest.
In me thou see'st the glowing of such fire
That on the ashes of his youth doth lie,
As the death-bed whereon it must expire,
Consumed with that which it was nourish'd by.
This thou perceivest, which makes thy love more strong,
To love that well which thou must leave ere long.

Let me not to the marriage of true minds
Admit impediments. Love is not love
Which alters when it alteration finds,
Or bends with the remover to remove:
O no! it is an ever-fixed mark
That looks on tempests and is never shaken;
It is the star to every wandering bark,
Whose worth's unknown, although his height be taken.
Love's not Time's fool, though rosy lips and cheeks
Within his bending sickle's compass come:
Love alters not with his brief hours and weeks,
But bears it out even to the edge of doom.
If this be error and upon me proved,
I never writ, nor no man ever loved.

My mistress' eyes are nothing like the sun;
Coral is far more red than her lips' red;
If snow be white, why then her breasts are dun;
If hairs be wires, black wires grow on her head.
I have seen roses damask'd, red and white,
But no such roses see I in her cheeks;
And in some perfumes is there more delight
Than in the breath that from my mistress reeks.
I love to hear her speak, yet well I know
That music hath a far more pleasing sound;
I grant I never saw goddess go;
My mistress, when she walks, treads on the ground:
And yet, by heaven, I think my love as rare
As any she belied with false compare.
"""

#: Character vocabulary of :data:`TEXT`, sorted (index = token id).
VOCAB = sorted(set(TEXT))

#: Default model: 105,408 parameters (lm_head tied to wte), nanoGPT's ``model_args`` keys.
DEFAULT_MODEL_ARGS: Dict[str, Any] = dict(
    n_layer=2, n_head=4, n_embd=64, block_size=32, bias=True, vocab_size=len(VOCAB), dropout=0.0
)

#: Default training config (plain types only; stored as ``config`` in every checkpoint).
#: Absolute paths are deliberately absent so that runs in different folders are byte-identical.
DEFAULT_CONFIG: Dict[str, Any] = dict(
    dataset="sonnets_char",
    batch_size=8,
    learning_rate=3e-3,
    min_lr=3e-4,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.99,
    grad_clip=1.0,
    eval_iters=4,
    val_fraction=0.1,
)


# --------------------------------------------------------------------------- model
class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT: PyTorch's lacks ``bias=False``)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, a: Dict[str, Any]):
        super().__init__()
        if a["n_embd"] % a["n_head"] != 0:
            raise ValueError(f"n_embd {a['n_embd']} is not a multiple of n_head {a['n_head']}")
        self.c_attn = nn.Linear(a["n_embd"], 3 * a["n_embd"], bias=a["bias"])
        self.c_proj = nn.Linear(a["n_embd"], a["n_embd"], bias=a["bias"])
        self.resid_dropout = nn.Dropout(a["dropout"])
        self.n_head, self.n_embd, self.dropout = a["n_head"], a["n_embd"], a["dropout"]

    def forward(self, x):
        B, T, C = x.size()  # batch, time, n_embd
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, a: Dict[str, Any]):
        super().__init__()
        self.c_fc = nn.Linear(a["n_embd"], 4 * a["n_embd"], bias=a["bias"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * a["n_embd"], a["n_embd"], bias=a["bias"])
        self.dropout = nn.Dropout(a["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, a: Dict[str, Any]):
        super().__init__()
        self.ln_1 = LayerNorm(a["n_embd"], bias=a["bias"])
        self.attn = CausalSelfAttention(a)
        self.ln_2 = LayerNorm(a["n_embd"], bias=a["bias"])
        self.mlp = MLP(a)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT: token + position embeddings, ``n_layer`` blocks, final LayerNorm,
    ``lm_head`` tied to ``transformer.wte`` (so the state_dict holds both keys on one storage)."""

    def __init__(self, model_args: Dict[str, Any]):
        super().__init__()
        a = dict(model_args)
        self.model_args = a
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(a["vocab_size"], a["n_embd"]),
                wpe=nn.Embedding(a["block_size"], a["n_embd"]),
                drop=nn.Dropout(a["dropout"]),
                h=nn.ModuleList([Block(a) for _ in range(a["n_layer"])]),
                ln_f=LayerNorm(a["n_embd"], bias=a["bias"]),
            )
        )
        self.lm_head = nn.Linear(a["n_embd"], a["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * a["n_layer"]))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        """``idx``: (B, T) int64 token ids, T <= block_size.  Returns ``(logits (B, T, vocab),
        loss)`` where ``loss`` is the mean cross-entropy (a 0-d tensor) or None without targets.
        Raises ValueError if T > block_size."""
        B, T = idx.size()
        if T > self.model_args["block_size"]:
            raise ValueError(f"sequence length {T} exceeds block_size {self.model_args['block_size']}")
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        """AdamW with nanoGPT's groups: weight decay on every >=2-D parameter (matmuls,
        embeddings), none on biases and LayerNorm weights."""
        params = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": nodecay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, foreach=False)


def build_model(model_args: Dict[str, Any]) -> nn.Module:
    """A fresh nanoGPT-style :class:`GPT` from nanoGPT ``model_args`` (keys ``n_layer``,
    ``n_head``, ``n_embd``, ``block_size``, ``vocab_size``, ``bias``, ``dropout``).
    Raises KeyError if a key is missing, ValueError if ``n_embd % n_head != 0``.
    Initialisation draws from torch's global RNG: seed it first for reproducibility."""
    missing = sorted(set(DEFAULT_MODEL_ARGS) - set(model_args))
    if missing:
        raise KeyError(f"model_args lacks {missing!r}")
    return GPT(model_args)


# --------------------------------------------------------------------------- data, schedule
def _data() -> tuple:
    """(train, val): 1-D int64 token tensors of :data:`TEXT`, split 90/10 by position."""
    ids = torch.tensor([VOCAB.index(c) for c in TEXT], dtype=torch.long)
    n = int(len(ids) * (1 - DEFAULT_CONFIG["val_fraction"]))
    return ids[:n], ids[n:]


def _get_batch(data, batch_size: int, block_size: int):
    """(x, y): two (batch_size, block_size) int64 tensors, y = x shifted by one.  Draws
    offsets from torch's global RNG (as nanoGPT does), so ``rng`` in a checkpoint matters."""
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


def lr_multiplier(it: int, *, warmup_iters: int, lr_decay_iters: int, learning_rate: float, min_lr: float) -> float:
    """LambdaLR factor at scheduler step ``it`` (= optimizer steps done): nanoGPT's
    ``get_lr`` (linear warm-up over ``warmup_iters`` steps, cosine decay to ``min_lr`` at
    ``lr_decay_iters``, flat after) divided by ``learning_rate``."""
    if it < warmup_iters:
        return (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr / learning_rate
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return (min_lr + coeff * (learning_rate - min_lr)) / learning_rate


def _make_scheduler(optimizer, config: Dict[str, Any]):
    kw = dict(
        warmup_iters=config["warmup_iters"],
        lr_decay_iters=config["lr_decay_iters"],
        learning_rate=config["learning_rate"],
        min_lr=config["min_lr"],
    )

    def fn(it):  # a plain function: LambdaLR.state_dict stores None for it
        return lr_multiplier(it, **kw)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


@torch.no_grad()
def _estimate_loss(model, train_data, val_data, config, block_size) -> Dict[str, float]:
    """Mean loss over ``eval_iters`` random batches per split (draws from the global RNG)."""
    out = {}
    model.eval()
    for split, data in (("train", train_data), ("val", val_data)):
        losses = [
            model(*_get_batch(data, config["batch_size"], block_size))[1].item()
            for _ in range(config["eval_iters"])
        ]
        out[split] = float(sum(losses) / len(losses))
    model.train()
    return out


# --------------------------------------------------------------------------- rng state
def get_rng_state() -> Dict[str, Any]:
    """torch, numpy and python RNG states in ``weights_only``-loadable types:
    ``torch``: uint8 tensor (5056 bytes for the CPU Mersenne Twister); ``numpy``: dict with
    ``bit_generator`` str, ``state`` int64 tensor (624,), ``pos``, ``has_gauss`` ints and
    ``cached_gaussian`` float; ``python``: :func:`random.getstate` (a tuple of ints)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": str(name),
            "state": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }


def set_rng_state(rng: Dict[str, Any]) -> None:
    """Inverse of :func:`get_rng_state`."""
    torch.set_rng_state(rng["torch"])
    n = rng["numpy"]
    np.random.set_state(
        (n["bit_generator"], n["state"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    py = rng["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))


# --------------------------------------------------------------------------- writing
def sha256_file(path: PathLike) -> str:
    """SHA-256 of a file's bytes as 64 lower-case hex digits."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _canonical(obj: Any) -> Any:
    """Copy of the containers of ``obj`` with every str interned (tensors are kept as is).

    Pickle memoizes by object identity, so without this the same checkpoint pickles to
    different bytes depending on whether, say, the ``"weight_decay"`` key of an optimizer
    param group is the same object as the config's (a fresh run) or one read back by
    ``torch.load`` (a resumed run)."""
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        out = type(obj)((_canonical(k), _canonical(v)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)  # state_dict()'s per-module version info
        if meta is not None:
            out._metadata = _canonical(meta)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_canonical(v) for v in obj)
    return obj


def serialize(ckpt: Dict[str, Any]) -> bytes:
    """``torch.save`` bytes of ``ckpt``, identical for equal checkpoints (see
    :func:`_canonical`).  Saved through a buffer, so the zip's record prefix is
    ``archive/`` whatever the file is later called (torch names it after the file's stem
    when given a path)."""
    buf = io.BytesIO()
    torch.save(_canonical(ckpt), buf)
    return buf.getvalue()


def save_checkpoint(ckpt: Dict[str, Any], path: PathLike) -> None:
    """Well-behaved write: bytes to ``<path>.tmp``, fsync, ``os.replace`` onto ``path``,
    fsync the folder, then the ``sha256sum``-format sidecar ``<path>.sha256``
    (``<64 hex>  <basename>\\n``), itself written the same way."""
    path = Path(path)
    data = serialize(ckpt)
    _atomic_write(path, data)
    digest = hashlib.sha256(data).hexdigest()
    _atomic_write(path.with_name(path.name + ".sha256"), f"{digest}  {path.name}\n".encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class _StallingWriter:
    """File-like object for ``torch.save`` that writes straight to an fd and, once
    ``limit`` bytes are written, signals ``notify_fd`` and blocks forever (until killed)."""

    def __init__(self, fd: int, limit: int, notify_fd: int, block_fd: int):
        self.fd, self.limit, self.notify_fd, self.block_fd = fd, limit, notify_fd, block_fd
        self.written = 0

    def write(self, b) -> int:
        b = bytes(b)
        room = self.limit - self.written
        if len(b) < room:
            self._write_all(b)
            return len(b)
        self._write_all(b[:room])
        os.write(self.notify_fd, b"K")  # "kill me now": exactly `limit` bytes are on disk
        while True:
            os.read(self.block_fd, 1)  # the parent never writes: block until SIGKILL

    def _write_all(self, b: bytes) -> None:
        view = memoryview(b)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.written += n

    def flush(self) -> None:
        pass


def crash_save(ckpt: Dict[str, Any], path: PathLike, *, truncate_fraction: float = 0.55,
               timeout_s: float = 60.0) -> int:
    """Naive writer killed mid-write: a forked child ``torch.save``s ``ckpt`` directly to
    ``path`` (no temp name, no sidecar) and receives SIGKILL once
    ``int(truncate_fraction * full_size)`` bytes are on disk.  Returns that byte count.

    Raises RuntimeError if the child fails before reaching the cut, is not killed by
    SIGKILL, or does not reach the cut within ``timeout_s`` seconds; ValueError unless
    0 < ``truncate_fraction`` < 1.  POSIX only (``os.fork``)."""
    if not 0.0 < truncate_fraction < 1.0:
        raise ValueError(f"truncate_fraction must be in (0, 1), got {truncate_fraction}")
    path = Path(path)
    full_size = len(serialize(ckpt))  # same bytes the child will stream out
    limit = int(truncate_fraction * full_size)
    notify_r, notify_w = os.pipe()
    block_r, block_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: only torch.save and os calls, then os._exit; never returns
        code = 1
        try:
            os.close(notify_r)
            os.close(block_w)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            torch.save(_canonical(ckpt), _StallingWriter(fd, limit, notify_w, block_r))
            os.write(notify_w, b"E")  # finished without reaching the cut: must not happen
        except BaseException:
            try:
                os.write(notify_w, b"E")
            except OSError:
                pass
        finally:
            os._exit(code)
    os.close(notify_w)
    os.close(block_r)
    try:
        ready, _, _ = select.select([notify_r], [], [], timeout_s)
        msg = os.read(notify_r, 1) if ready else b""
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(notify_r)
        os.close(block_w)
    if msg != b"K":
        why = "timed out" if not ready else "failed"
        raise RuntimeError(f"{path}: writer child {why} before the cut at {limit} of {full_size} bytes")
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise RuntimeError(f"{path}: expected the writer child to die of SIGKILL, got wait status {status}")
    actual = path.stat().st_size
    if actual != limit:
        raise RuntimeError(f"{path}: expected {limit} bytes after the kill, found {actual}")
    return limit


def flip_byte_in_tensor_record(path: PathLike) -> tuple:
    """Flip one byte (XOR 0xFF) in the middle of the largest ``*/data/<n>`` record (the
    lowest ``n`` among equals: the first such model weight) of the torch zip at ``path``, in place.  The byte is the least significant byte of a float32
    element, so values stay finite and ``torch.load`` still succeeds; the zip CRC-32 and any
    file hash change.  Returns ``(file_offset_bytes, member_name)``.
    Raises ValueError if the file has no tensor data record."""
    path = Path(path)
    with zipfile.ZipFile(path) as zf:
        records = [i for i in zf.infolist() if "/data/" in i.filename and i.filename.rsplit("/", 1)[-1].isdigit()]
        if not records:
            raise ValueError(f"{path}: expected a */data/<n> tensor record, found none")
        info = max(records, key=lambda i: (i.file_size, -int(i.filename.rsplit("/", 1)[-1])))
    with open(path, "r+b") as f:
        f.seek(info.header_offset)
        local = f.read(30)  # local file header, APPNOTE.TXT 4.3.7
        sig, name_len, extra_len = struct.unpack("<I22xHH", local)
        if sig != 0x04034B50:
            raise ValueError(f"{path}: expected a local header at {info.header_offset}, found {sig:#x}")
        data_start = info.header_offset + 30 + name_len + extra_len
        offset = data_start + (info.file_size // 2) // 4 * 4  # LSB of a little-endian float32
        f.seek(offset)
        old = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([old ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    return offset, info.filename


# --------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    """What :func:`train` did.  ``saved``: checkpoint paths in save order; ``losses``:
    train loss (mean cross-entropy, nats) at each save step; ``iter_num``: optimizer steps
    counted at the end (after a ``restore="weights"`` restart, counted from 0)."""

    run_dir: Path
    saved: List[Path]
    losses: Dict[int, float]
    iter_num: int
    model: Any = field(repr=False, default=None)


def ckpt_name(step: int) -> str:
    """``ckpt_{step:06d}.pt``."""
    return f"ckpt_{step:06d}.pt"


def train(
    out_dir: PathLike,
    *,
    max_steps: int,
    save_every: int,
    seed: int = 1337,
    start_from: Optional[PathLike] = None,
    restore: str = "full",
    model_args: Optional[Dict[str, Any]] = None,
    config: Optional[Dict[str, Any]] = None,
    on_step: Optional[Callable[[int, nn.Module, Any], None]] = None,
    mutate: Optional[Callable[[int, Dict[str, Any]], Optional[Dict[str, Any]]]] = None,
    save: Optional[Callable[[Dict[str, Any], Path], None]] = None,
    on_save: Optional[Callable[[int, Path, Dict[str, Any]], None]] = None,
    filename: Callable[[int], str] = ckpt_name,
    num_threads: int = 1,
) -> TrainResult:
    """Train the demo GPT up to step ``max_steps`` and save every ``save_every`` steps.

    A *step* is one optimizer update; the checkpoint saved after step ``s`` has
    ``iter_num == s`` and ``scheduler["last_epoch"] == s`` and is named ``filename(s)``.

    ``start_from``: a checkpoint (or a bare model state_dict) to start from.  ``restore="full"`` resumes faithfully
    (model, optimizer, scheduler, RNG, ``iter_num``, ``best_val_loss``; continuing gives the
    same bytes as never stopping); ``restore="weights"`` loads only ``model`` and starts
    step counting, optimizer, scheduler (warm-up again) from scratch: a restart that
    resets the step.  Hooks, for building broken runs in tests:

    * ``on_step(step, model, optimizer)`` after every optimizer step (e.g. write NaN into a
      parameter to inject a real divergence at step k);
    * ``mutate(step, ckpt) -> ckpt | None`` on the checkpoint dict before saving (drop
      ``optimizer``, return ``ckpt["model"]`` for weights only, poison a tensor, rewrite
      ``iter_num``); returning None skips that save;
    * ``save(ckpt, path)`` replaces the writer (default :func:`save_checkpoint`);
    * ``on_save(step, path, ckpt)`` after each save.

    Seeds torch, numpy and python ``random`` with ``seed`` (unless fully restoring) and
    sets torch's intra-op threads to ``num_threads`` for the call (restored after), so
    results are bit-reproducible on one machine.  Raises ValueError on bad arguments,
    KeyError if ``restore="full"`` and ``start_from`` lacks a key of the schema.
    """
    if max_steps < 1 or save_every < 1:
        raise ValueError(f"max_steps and save_every must be >= 1, got {max_steps} and {save_every}")
    if restore not in ("full", "weights"):
        raise ValueError(f"restore must be 'full' or 'weights', got {restore!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save = save or save_checkpoint
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        return _train(out_dir, max_steps, save_every, seed, start_from, restore, model_args, config,
                      on_step, mutate, save, on_save, filename)
    finally:
        torch.set_num_threads(prev_threads)


def _train(out_dir, max_steps, save_every, seed, start_from, restore, model_args, config,
           on_step, mutate, save, on_save, filename) -> TrainResult:
    src = torch.load(start_from, weights_only=True) if start_from is not None else None
    if src is not None and "model" not in src:  # a bare state_dict (weights-only file)
        src = {"model": src}
    if src is not None and restore == "full":
        missing = sorted(set(NANOGPT_KEYS + EXTRA_KEYS) - set(src))
        if missing:
            raise KeyError(f"{start_from}: a full restore needs {missing!r}, which the checkpoint lacks")
    if src is not None and model_args is None:
        model_args = src.get("model_args")
    model_args = dict(model_args or DEFAULT_MODEL_ARGS)
    cfg = dict(DEFAULT_CONFIG)
    if src is not None and restore == "full":
        cfg.update(src["config"])
    else:  # a fresh schedule: warm up over 1/12 of the run, decay over all of it
        cfg.update(warmup_iters=max(1, max_steps // 12), lr_decay_iters=max_steps)
    cfg.update(max_iters=max_steps, save_every=save_every, seed=seed)
    cfg.update(config or {})

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    model = build_model(model_args)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    scheduler = _make_scheduler(optimizer, cfg)
    iter_num, best_val_loss = 0, float("inf")
    if src is not None:
        model.load_state_dict(src["model"])
        if restore == "full":
            optimizer.load_state_dict(src["optimizer"])
            scheduler.load_state_dict(src["scheduler"])
            set_rng_state(src["rng"])
            iter_num, best_val_loss = int(src["iter_num"]), float(src["best_val_loss"])
    del src

    train_data, val_data = _data()
    block_size = model_args["block_size"]
    saved: List[Path] = []
    losses: Dict[int, float] = {}
    model.train()
    while iter_num < max_steps:
        x, y = _get_batch(train_data, cfg["batch_size"], block_size)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if on_step is not None:
            on_step(iter_num, model, optimizer)
        if iter_num % save_every:
            continue
        ev = _estimate_loss(model, train_data, val_data, cfg, block_size)
        best_val_loss = min(best_val_loss, ev["val"])
        ckpt = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "model_args": dict(model_args),
            "iter_num": iter_num,
            "best_val_loss": best_val_loss,
            "config": dict(cfg),
            "scheduler": scheduler.state_dict(),
            "rng": get_rng_state(),
            "loss": float(loss.item()),
        }
        losses[iter_num] = ckpt["loss"]
        if mutate is not None:
            ckpt = mutate(iter_num, ckpt)
            if ckpt is None:
                continue
        path = out_dir / filename(iter_num)
        save(ckpt, path)
        saved.append(path)
        if on_save is not None:
            on_save(iter_num, path, ckpt)
    return TrainResult(run_dir=out_dir, saved=saved, losses=losses, iter_num=iter_num, model=model)


# --------------------------------------------------------------------------- the demo
@dataclass
class DemoRun:
    """A staged incident.  ``steps``: every save step, oldest first; ``truncated``,
    ``flipped``: file names (in ``run_dir``) of the killed newest save and of the bit-rotted
    one; ``flipped_offset``: absolute byte offset of the flipped byte in ``flipped``;
    ``intact``: names of the undamaged checkpoints; ``losses``: train loss (nats) at each
    save step, including the truncated one; ``truncated_bytes``: size of ``truncated``;
    ``flipped_member``: zip member holding the flipped byte."""

    run_dir: Path
    steps: List[int]
    truncated: str
    flipped: str
    flipped_offset: int
    intact: List[str]
    losses: Dict[int, float]
    truncated_bytes: int = 0
    flipped_member: str = ""


def make_demo_run(out_dir: PathLike, *, max_steps: int = 600, save_every: int = 100, seed: int = 1337,
                  incident: bool = True) -> DemoRun:
    """Train the demo run into ``out_dir`` and, if ``incident``, stage the crash.

    Saves at steps ``save_every, 2*save_every, ... <= max_steps``.  With ``incident``:
    the save at the last of those steps (``max_steps`` when it is a multiple of
    ``save_every``) is made by :func:`crash_save` (truncated at 55 % of its size, no
    sidecar), and the save at step ``save_every * (n_saves // 2)`` (300 with defaults) gets
    one byte flipped by :func:`flip_byte_in_tensor_record` (its sidecar keeps the original
    hash).  Without ``incident`` every save is intact and ``truncated``/``flipped`` are "".

    Takes ~5 s with defaults on one core (~3.5 s of it training; ~1.2 s is torch's one-time
    lazy import of ``torch._dynamo`` on the first ``torch.optim`` construction in a process).
    Raises FileExistsError if ``out_dir`` already holds ``ckpt_*`` files, ValueError if
    ``incident`` and fewer than 3 saves would be made.
    """
    out_dir = Path(out_dir)
    n_saves = max_steps // save_every
    if incident and n_saves < 3:
        raise ValueError(f"incident needs >= 3 saves, got {n_saves} (max_steps={max_steps}, save_every={save_every})")
    if out_dir.exists():
        stale = sorted(p.name for p in out_dir.glob("ckpt_*"))
        if stale:
            raise FileExistsError(f"{out_dir}: expected no ckpt_* files, found {stale}")
    last = n_saves * save_every
    flipped_step = save_every * (n_saves // 2)
    cut = {}

    def writer(ckpt, path):
        if incident and ckpt["iter_num"] == last:
            cut["bytes"] = crash_save(ckpt, path)
        else:
            save_checkpoint(ckpt, path)

    res = train(out_dir, max_steps=max_steps, save_every=save_every, seed=seed, save=writer)
    steps = sorted(res.losses)
    names = {s: ckpt_name(s) for s in steps}
    if not incident:
        return DemoRun(out_dir, steps, "", "", 0, [names[s] for s in steps], res.losses)
    offset, member = flip_byte_in_tensor_record(out_dir / names[flipped_step])
    intact = [names[s] for s in steps if s not in (last, flipped_step)]
    return DemoRun(out_dir, steps, names[last], names[flipped_step], offset, intact, res.losses,
                   truncated_bytes=cut["bytes"], flipped_member=member)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m ckptaudit.demo OUT_DIR [--max-steps N] [--save-every N] [--seed N]
    [--no-incident]``: build the demo run and print what was staged.  Returns 0."""
    p = argparse.ArgumentParser(prog="python -m ckptaudit.demo", description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--no-incident", action="store_true")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    run = make_demo_run(a.out_dir, max_steps=a.max_steps, save_every=a.save_every, seed=a.seed,
                        incident=not a.no_incident)
    dt = time.perf_counter() - t0
    print(f"demo run in {run.run_dir} ({dt:.1f} s): saves at steps {run.steps}")
    for s in run.steps:
        print(f"  step {s:6d}  loss {run.losses[s]:.4f}  {ckpt_name(s)}")
    if run.truncated:
        print(f"truncated: {run.truncated} ({run.truncated_bytes} bytes, writer killed with SIGKILL, no sidecar)")
        print(f"flipped:   {run.flipped} (byte {run.flipped_offset} in {run.flipped_member}; sidecar keeps old hash)")
    return 0


# --------------------------------------------------------------------------- restore drill hook
def restore_hook(path: PathLike, device: str = "cpu"):
    """Restore hook of the demo trainer for ``ckptaudit drill`` (``drill.hook:
    "ckptaudit.demo:restore_hook"``): resume the checkpoint at ``path`` on ``device`` the way
    :func:`train` does with ``restore="full"`` and return a :class:`ckptaudit.drill.Restored`.

    Reads the file with ``torch.load(path, map_location="cpu", weights_only=True)`` (CPU first:
    ``torch.set_rng_state`` takes a CPU ByteTensor; ``load_state_dict`` then copies onto ``device``).
    Like a typical resume script it tolerates a missing ``scheduler`` (the schedule restarts from
    step 0) and a missing ``rng`` (seeds from ``config["seed"]``); the drill reports what each costs.

    ``saved["loss"]`` is the checkpoint's ``loss`` (train loss of the save step's batch, nats),
    compared with the mean loss over fixed train windows (``block_size`` tokens at every 16th offset:
    no RNG); without ``loss``, ``best_val_loss`` over fixed validation windows (every 8th offset).
    ``batches`` draws with :func:`_get_batch` from torch's global RNG as training does;
    ``train_step`` is the loop body of :func:`_train`; ``lr_at(s)`` is ``learning_rate *
    lr_multiplier(s, ...)`` per param group.  Bit-exact on CPU with one intra-op thread (the drill
    child sets it), so ``deterministic`` is True there.
    Raises KeyError if the checkpoint lacks ``model``, ``optimizer``, ``model_args`` or ``config``.
    """
    from .drill import SimpleRestored

    dev = torch.device(device)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict):
        raise KeyError(f"{path}: expected a checkpoint dict, found {type(ckpt).__name__}")
    missing = sorted({"model", "optimizer", "model_args", "config"} - set(ckpt))
    if missing:
        raise KeyError(f"{path}: the demo trainer cannot resume without {missing!r}")
    cfg = dict(DEFAULT_CONFIG)
    cfg.update(ckpt["config"])
    model_args = dict(ckpt["model_args"])
    model = build_model(model_args).to(dev)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    scheduler = _make_scheduler(optimizer, cfg)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt.get("scheduler") is not None:
        scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt.get("rng") is not None:
        set_rng_state(ckpt["rng"])
    else:
        seed = int(cfg.get("seed", 1337))
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
    step = int(ckpt["iter_num"]) if "iter_num" in ckpt else int(scheduler.last_epoch)
    model.train()

    train_data, val_data = _data()
    block, bs = model_args["block_size"], cfg["batch_size"]
    if ckpt.get("loss") is not None:
        data, stride, loss, source = train_data, 16, float(ckpt["loss"]), "loss (train loss of the save step)"
    else:
        data, stride, loss, source = val_data, 8, ckpt.get("best_val_loss"), "best_val_loss"
    ix = range(0, len(data) - block - 1, stride)
    loss_batch = (torch.stack([data[i : i + block] for i in ix]).to(dev),
                  torch.stack([data[i + 1 : i + 1 + block] for i in ix]).to(dev))  # (n_windows, block) each

    def batches():
        while True:
            x, y = _get_batch(train_data, bs, block)
            yield x.to(dev), y.to(dev)

    def train_step(batch):
        x, y = batch
        _, l = model(x, y)
        l.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(l.item()), float(gn.item())

    @torch.no_grad()
    def eval_loss(batch):
        model.eval()
        try:
            return float(model(*batch)[1].item())
        finally:
            model.train()

    sched_kw = dict(warmup_iters=cfg["warmup_iters"], lr_decay_iters=cfg["lr_decay_iters"],
                    learning_rate=cfg["learning_rate"], min_lr=cfg["min_lr"])

    def lr_at(s):
        return [cfg["learning_rate"] * lr_multiplier(s, **sched_kw) for _ in optimizer.param_groups]

    saved = dict(ckpt)
    saved.update(rng=ckpt.get("rng"), scheduler=ckpt.get("scheduler"), loss=loss, loss_source=source)
    return SimpleRestored(model=model, optimizer=optimizer, scheduler=scheduler, scaler=None, step=step,
                          saved=saved, loss_batch=loss_batch, batches=batches(), train_step=train_step,
                          eval_loss=eval_loss, deterministic=dev.type == "cpu", lr_at=lr_at,
                          rng_state=get_rng_state)


if __name__ == "__main__":
    sys.exit(main())
