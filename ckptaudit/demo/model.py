"""The demo's model: a nanoGPT-style character-level GPT and its default ``model_args``."""

from __future__ import annotations

import math
from typing import Any, Dict

import torch
import torch.nn as nn
from torch.nn import functional as F

from .text import VOCAB

#: Default model: 105,408 parameters (lm_head tied to wte), nanoGPT's ``model_args`` keys.
DEFAULT_MODEL_ARGS: Dict[str, Any] = dict(
    n_layer=2, n_head=4, n_embd=64, block_size=32, bias=True, vocab_size=len(VOCAB), dropout=0.0
)


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
