"""LlamaGen's GPT (FoundationVision/LlamaGen ``autoregressive/models/gpt.py``), inference only, plain PyTorch.

Same parameters and state-dict keys as upstream, same arithmetic (RMSNorm and RoPE in float32, logits in float32),
with a KV cache that can be cropped so that the Jacobi loop can roll it back.

Sequence layout: ``cls_token_num`` condition positions (c2i: one class embedding; t2i: 120 projected caption
embeddings), then image token k at position ``cls_token_num + k``. The 2-D RoPE table has ZERO rows (cos = sin = 0)
for the condition positions, so their q and k are zero, as upstream; image position k rotates by the cell
(k // W, k % W): the first half of the (even, odd) pairs by row, the second half by column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["CAPTION_TOKENS", "PRESETS", "KVCache", "ModelArgs", "RowKVCache", "Transformer", "rope_table_2d"]

# upstream GPT_models: (n_layer, n_head, dim) per name; B..XXXL are the class-conditional sizes, 1B..7B text
PRESETS = {
    "GPT-B": dict(n_layer=12, n_head=12, dim=768),
    "GPT-L": dict(n_layer=24, n_head=16, dim=1024),
    "GPT-XL": dict(n_layer=36, n_head=20, dim=1280),
    "GPT-XXL": dict(n_layer=48, n_head=24, dim=1536),
    "GPT-XXXL": dict(n_layer=48, n_head=40, dim=2560),
    "GPT-1B": dict(n_layer=22, n_head=32, dim=2048),
    "GPT-3B": dict(n_layer=24, n_head=32, dim=3200),
    "GPT-7B": dict(n_layer=32, n_head=32, dim=4096),
}
# upstream CaptionEmbedder(token_num=120): the learned unconditional caption always has 120 rows
CAPTION_TOKENS = 120
MODEL_TYPES = ("c2i", "t2i")


@dataclass
class ModelArgs:
    """Upstream's ModelArgs minus its training-only fields (dropouts, init range, max batch / length)."""

    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: Optional[int] = None
    multiple_of: int = 256  # SwiGLU hidden size rounded up to a multiple of this
    ffn_dim_multiplier: Optional[float] = None
    rope_base: float = 10000
    norm_eps: float = 1e-5
    num_classes: int = 1000
    caption_dim: int = 2048
    class_dropout_prob: float = 0.1  # > 0: the class table has a null-class row (the CFG unconditional class)
    model_type: str = "c2i"
    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256  # image tokens: grid²

    def __post_init__(self):
        problems = []
        if self.model_type not in MODEL_TYPES:
            problems.append(f"model_type={self.model_type!r} is not one of {MODEL_TYPES}")
        if self.dim % self.n_head:
            problems.append(f"dim={self.dim} is not a multiple of n_head={self.n_head}")
        elif self.head_dim % 4:
            problems.append(f"head_dim={self.head_dim} must be a multiple of 4 (2-D RoPE: half the pairs per axis)")
        if self.n_head % self.kv_heads:
            problems.append(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        if math.isqrt(self.block_size) ** 2 != self.block_size:
            problems.append(f"block_size={self.block_size} is not a square grid")
        if self.model_type == "c2i" and self.cls_token_num != 1:
            problems.append(f"c2i embeds one class token: cls_token_num must be 1, got {self.cls_token_num}")
        if self.model_type == "t2i" and self.cls_token_num != CAPTION_TOKENS:
            problems.append(f"t2i conditions on {CAPTION_TOKENS} caption tokens: cls_token_num must be "
                            f"{CAPTION_TOKENS}, got {self.cls_token_num}")
        if problems:
            raise ValueError("LlamaGen ModelArgs: " + "; ".join(problems))

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def grid(self) -> int:
        return math.isqrt(self.block_size)

    @property
    def class_rows(self) -> int:
        """Rows of the c2i class table: the classes, plus the null class when trained with class dropout."""
        return self.num_classes + (self.class_dropout_prob > 0)

    @property
    def ffn_hidden(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return -(-hidden // self.multiple_of) * self.multiple_of

    @property
    def max_seq_len(self) -> int:
        return self.cls_token_num + self.block_size


# ----------------------------------------------------------------------------------------------------------------------
# rotary embedding
# ----------------------------------------------------------------------------------------------------------------------
def rope_table_2d(grid: int, head_dim: int, base: float, cls_token_num: int) -> torch.Tensor:
    """[cls_token_num + grid², head_dim // 2, 2] (cos, sin) per position and pair; zeros for the condition rows."""
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))  # [half // 2]
    angles = torch.outer(torch.arange(grid, dtype=torch.float32), freqs)  # [grid, half // 2]
    cells = torch.cat([angles[:, None, :].expand(-1, grid, -1),  # rows
                       angles[None, :, :].expand(grid, -1, -1)], dim=-1)  # columns -> [grid, grid, half]
    table = torch.stack([torch.cos(cells), torch.sin(cells)], dim=-1).flatten(0, 1)  # [grid², half, 2]
    return torch.cat([torch.zeros(cls_token_num, half, 2), table])


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] rotated by table [T, D // 2, 2] (or per row [B, T, D // 2, 2]) as (even, odd) pairs, in
    float32."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)  # [B, T, H, D/2, 2]
    table = table if table.ndim == 4 else table[None]  # [1 or B, T, D/2, 2]
    cos, sin = table[:, :, None, :, 0], table[:, :, None, :, 1]  # [1 or B, T, 1, D/2]
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
    return rotated.flatten(3).type_as(x)


# ----------------------------------------------------------------------------------------------------------------------
# KV cache
# ----------------------------------------------------------------------------------------------------------------------
class KVCache:
    """Keys and values of every layer for positions [0, length); ``crop`` rolls back, ``write`` appends."""

    def __init__(self, args: ModelArgs, rows: int, dtype: torch.dtype, device):
        shape = (args.n_layer, rows, args.kv_heads, args.max_seq_len, args.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """k, v [R, Hkv, T, D] at positions [start, start + T) -> the layer's keys, values [R, Hkv, start + T, D]."""
        end = start + k.shape[2]
        self.keys[layer, :, :, start:end] = k
        self.values[layer, :, :, start:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a KV cache of length {self.length} to {length}")
        self.length = length


class RowKVCache:
    """The static per-row cache of the fixed-shape loop: ``capacity`` slots per row, written at per-row slots
    (``write`` with a slots tensor [R, T]); attention reads every slot through an explicit mask."""

    def __init__(self, args: ModelArgs, rows: int, capacity: int, dtype: torch.dtype, device):
        shape = (args.n_layer, rows, args.kv_heads, capacity, args.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v [R, Hkv, T, D] at slots [R, T] -> the layer's keys, values [R, Hkv, capacity, D]."""
        from ..cache import write_rows

        write_rows(self.keys[layer], slots, k)
        write_rows(self.values[layer], slots, v)
        return self.keys[layer], self.values[layer]


def attention_mask(start: int, length: int, key_valid: Optional[torch.Tensor], device) -> torch.Tensor:
    """Queries at [start, start + length) over keys [0, start + length): causal, padded condition positions hidden
    from every query but themselves (upstream's emb_masks and eye). -> bool [R or 1, 1, length, start + length]."""
    q_pos = torch.arange(start, start + length, device=device)[:, None]  # [T, 1]
    k_pos = torch.arange(start + length, device=device)[None, :]  # [1, S]
    allowed = k_pos <= q_pos  # [T, S]
    if key_valid is None:
        return allowed[None, None]
    allowed = (allowed & key_valid[:, None, : start + length]) | (k_pos == q_pos)  # [R, T, S]
    return allowed[:, None]


# ----------------------------------------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(torch.mean(x32 * x32, dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_hidden, bias=False)
        self.w3 = nn.Linear(args.dim, args.ffn_hidden, bias=False)
        self.w2 = nn.Linear(args.ffn_hidden, args.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head, self.kv_heads, self.head_dim = args.n_head, args.kv_heads, args.head_dim
        self.wqkv = nn.Linear(args.dim, (args.n_head + 2 * args.kv_heads) * args.head_dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x, rope, start: int, mask, cache: Optional[KVCache]):
        rows, length, dim = x.shape
        kv_size = self.kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([dim, kv_size, kv_size], dim=-1)
        q = apply_rope(q.view(rows, length, self.n_head, self.head_dim), rope).transpose(1, 2)  # [R, H, T, D]
        k = apply_rope(k.view(rows, length, self.kv_heads, self.head_dim), rope).transpose(1, 2)  # [R, Hkv, T, D]
        v = v.view(rows, length, self.kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.write(self.layer, start, k, v)  # [R, Hkv, start + T, D]
        group = self.n_head // self.kv_heads
        if group > 1:  # query head h reads kv head h // group
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [R, H, T, D]
        return self.wo(out.transpose(1, 2).reshape(rows, length, dim))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.attention = Attention(args, layer)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, rope, start, mask, cache):
        h = x + self.attention(self.attention_norm(x), rope, start, mask, cache)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embedding_table = nn.Embedding(args.class_rows, args.dim)

    def forward(self, labels):  # [R] -> [R, 1, D]
        return self.embedding_table(labels).unsqueeze(1)


class CaptionMLP(nn.Module):
    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, dim, bias=False)
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.cap_proj = CaptionMLP(args.caption_dim, args.dim)
        # the learned unconditional caption (a buffer upstream, so it is in the state dict)
        self.register_buffer("uncond_embedding", torch.zeros(CAPTION_TOKENS, args.caption_dim))

    def forward(self, caption):  # [R, 120, C] -> [R, 120, D]
        return self.cap_proj(caption)


# ----------------------------------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------------------------------
class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.cls_embedding = LabelEmbedder(args) if args.model_type == "c2i" else CaptionEmbedder(args)
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.n_layer))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("rope", self._rope_table(), persistent=False)  # [cls + grid², D/2, 2]

    def _rope_table(self) -> torch.Tensor:
        args = self.args
        return rope_table_2d(args.grid, args.head_dim, args.rope_base, args.cls_token_num)

    def _apply(self, fn, recurse=True):
        # the RoPE table follows the device but stays float32 (upstream keeps it outside the module's dtype casts);
        # recomputed rather than moved, so that it also survives to_empty() / the meta device
        super()._apply(fn, recurse)
        self.rope = self._rope_table().to(self.rope.device)
        return self

    def embed_condition(self, cond: torch.Tensor) -> torch.Tensor:
        """c2i: class ids [R] -> [R, 1, D]; t2i: captions [R, 120, caption_dim] -> [R, 120, D]."""
        return self.cls_embedding(cond)[:, : self.args.cls_token_num]

    def forward(self, h: torch.Tensor, start: int = 0, cache: Optional[KVCache] = None,
                key_valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        """h [R, T, D] input embeddings at positions [start, start + T) -> logits [R, T, V] float32.

        With a cache, its keys and values at [start, start + T) are written (start must be its length) and the
        queries attend to [0, start + T); without one, start must be 0. key_valid [R, >= start + T] bool: False at
        padded condition positions (None: none padded).
        """
        length = h.shape[1]
        if cache is None and start != 0:
            raise ValueError("a forward without a KV cache starts at position 0")
        if cache is not None and start != cache.length:
            raise ValueError(f"the KV cache holds {cache.length} positions; a forward from {start} needs a crop first")
        if start + length > self.args.max_seq_len:
            raise ValueError(f"positions up to {start + length} exceed cls_token_num + block_size = "
                             f"{self.args.max_seq_len}")
        mask = attention_mask(start, length, key_valid, h.device)  # [R or 1, 1, T, start + T]
        rope = self.rope[start : start + length]  # [T, D/2, 2]
        for layer in self.layers:
            h = layer(h, rope, start, mask, cache)
        if cache is not None:
            cache.length = start + length
        return self.output(self.norm(h)).float()  # [R, T, V]

    def forward_rows(self, h: torch.Tensor, positions: torch.Tensor, cache: RowKVCache,
                     visible: torch.Tensor, slots: Optional[torch.Tensor] = None) -> torch.Tensor:
        """h [R, T, D] inputs at sequence positions [R, T] (their RoPE rows; their cache slots too unless ``slots``
        [R, T] is given, as a draft tree's siblings share a position) -> logits [R, T, V] float32, attending to the
        slots ``visible`` [R, T, capacity] bool marks. Positions past the sequence (junk inputs of the loop's last
        windows) take the last RoPE row."""
        rope = self.rope[positions.clamp(max=self.rope.shape[0] - 1)]  # [R, T, D/2, 2]
        mask = visible[:, None]  # [R, 1, T, S]
        for layer in self.layers:
            h = layer(h, rope, positions if slots is None else slots, mask, cache)
        return self.output(self.norm(h)).float()
