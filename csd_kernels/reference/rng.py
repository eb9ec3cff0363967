"""The random numbers of every backend, one definition: Philox4x32-10 (Salmon et al., 2011), see :func:`philox4x32`.

Keys and counters:

* key = the row's seed as (low 32 bits, high 32 bits).
* step stream, one Philox call per (row, position):
  counter = (pos, row_id, offset_lo, offset_hi); lane 0 -> u_accept, lane 1 -> u_sample, lane 2 -> the uniformly
  random draft token floor(x·V / 2^32) that a decoding loop puts at a fresh position (:func:`random_draft_tokens`),
  lane 3 -> the uniform of a fresh draft drawn from an informed q instead (the row above's p, :func:`draft_uniforms`).
* gumbel stream, one call per (row, position, 4 tokens): counter = (v >> 2, pos, row_id, 0x80000000), lane v & 3.
  It does not depend on ``offset``, so the noise is the same in every iteration of a decoding loop.

where pos = (positions[b] + i) mod 2^32 (absolute token index), row_id = b when one seed is shared by the batch and 0
when every row has its own seed (so a row's stream does not depend on its place in a batch), and offset < 2^63 so the
step stream's top bit is always 0. ``offset`` is one value shared by the batch ([1]) or one per row ([B]): the step
stream of row b uses offset[b] (offset[0] when it is shared), so with per-row seeds and offsets a row's step stream
does not depend on the batch at all (a decoding loop keys each row by its own attempt count). A 32-bit Philox word x
becomes the uniform ((x >> 9) + 0.5) · 2^-23, which is exact in float32 and lies strictly inside (0, 1).

The tree stream (draft trees, :mod:`.tree`): counter (slot, 2^31, offset_lo, TAG | row_id) for the walk's uniforms and
(v >> 2, level, offset_lo, TAG | row_id) for the sibling candidates' Gumbel keys, TAG = TREE_STREAM_TAG.
"""

from __future__ import annotations

import torch

__all__ = ["PHILOX_M0", "PHILOX_M1", "PHILOX_W0", "PHILOX_W1", "PHILOX_ROUNDS", "GUMBEL_STREAM_TAG", "TREE_STREAM_TAG",
           "philox4x32", "uniform_from_bits", "step_uniforms", "random_draft_tokens", "draft_uniforms",
           "gumbel_uniforms", "tree_uniforms", "tree_gumbel_uniforms"]

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
GUMBEL_STREAM_TAG = 0x80000000
TREE_STREAM_TAG = 0xC0000000  # word 3 of the tree stream's counter (the step stream's top bit is 0, gumbel's is 10)
_MASK32 = 0xFFFFFFFF


# --------------------------------------------------------------------------------------------------------------------
# Philox4x32-10 on int64 tensors holding uint32 values
# --------------------------------------------------------------------------------------------------------------------
def _mulhilo32(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of multiplier·x for uint32 values held in int64, without int64 overflow."""
    low_part = multiplier * (x & 0xFFFF)  # < 2^48
    high_part = multiplier * (x >> 16)  # < 2^48; product = low_part + high_part·2^16
    lo = (low_part + ((high_part & 0xFFFF) << 16)) & _MASK32
    hi = (((low_part >> 16) + high_part) >> 16) & _MASK32
    return hi, lo


def philox4x32(c0, c1, c2, c3, k0, k1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1); all uint32 values in int64 tensors.

    Shape: every argument broadcasts to a common shape, which the four outputs have.
    """
    words = (c0, c1, c2, c3, k0, k1)
    device = next((t.device for t in words if isinstance(t, torch.Tensor)), None)  # ints join the tensors' device
    words = [torch.as_tensor(t, dtype=torch.int64, device=device) for t in words]
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(*words)
    c0, c1, c2, c3 = (c & _MASK32 for c in (c0, c1, c2, c3))
    k0, k1 = k0 & _MASK32, k1 & _MASK32
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo32(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & _MASK32
        k1 = (k1 + PHILOX_W1) & _MASK32
    return c0, c1, c2, c3


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Map uint32 words (in int64) to float32 uniforms ((x >> 9) + 0.5)·2^-23 in the open interval (0, 1)."""
    return ((bits >> 9).to(torch.float32) + 0.5) * (2.0**-23)


def _seed_key(seed: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row Philox key halves and row ids: a shared seed keys rows by index, per-row seeds by themselves."""
    seed = seed.reshape(-1).to(torch.int64)
    if seed.numel() == 1:
        seed = seed.expand(batch)
        row_id = torch.arange(batch, dtype=torch.int64, device=seed.device)
    else:
        row_id = torch.zeros(batch, dtype=torch.int64, device=seed.device)
    return seed & _MASK32, (seed >> 32) & _MASK32, row_id


def _row_offsets(offset: torch.Tensor, batch: int) -> torch.Tensor:
    """[B, 1] int64 step-stream offset of each row: offset[b] when one per row is given, else offset[0]."""
    offset = torch.as_tensor(offset, dtype=torch.int64).reshape(-1)
    if offset.numel() == 1:
        return offset.expand(batch)[:, None]
    if offset.numel() != batch:
        raise ValueError(f"offset: expected 1 or {batch} values, got {offset.numel()}")
    return offset[:, None]


def _absolute_positions(positions: torch.Tensor, length: int) -> torch.Tensor:
    """[B, L] uint32 (in int64) absolute index of each window position."""
    window = torch.arange(length, dtype=torch.int64, device=positions.device)
    return (positions.reshape(-1, 1).to(torch.int64) + window) & _MASK32


def step_uniforms(seed: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, length: int):
    """(u_accept, u_sample), each [B, L] float32, from the step stream.

    Shape: seed [1] or [B] int64, offset [1] or [B] int64 (row b uses offset[b]), positions [B] int64.
    """
    batch = positions.numel()
    k0, k1, row_id = _seed_key(seed, batch)
    offset = _row_offsets(offset, batch)
    pos = _absolute_positions(positions, length)
    lane0, lane1, _, _ = philox4x32(
        pos, row_id[:, None], offset & _MASK32, (offset >> 32) & _MASK32, k0[:, None], k1[:, None]
    )
    return uniform_from_bits(lane0), uniform_from_bits(lane1)


def random_draft_tokens(seed: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, length: int,
                        vocab: int) -> torch.Tensor:
    """[B, L] int64 uniformly random tokens in [0, V) from lane 2 of the step stream (q = 1/V drafts).

    Keyed like the verification uniforms, so a decoding loop's initial drafts depend on (seed, position, offset) only.
    Shape: seed [1] or [B], offset [1] or [B] (row b uses offset[b]), positions [B].
    """
    batch = positions.numel()
    k0, k1, row_id = _seed_key(seed, batch)
    offset = _row_offsets(offset, batch)
    pos = _absolute_positions(positions, length)
    _, _, lane2, _ = philox4x32(pos, row_id[:, None], offset & _MASK32, (offset >> 32) & _MASK32, k0[:, None],
                                k1[:, None])
    return (lane2 * vocab) >> 32


def draft_uniforms(seed: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    """[B, L] float32 uniforms from lane 3 of the step stream: the inverse-CDF draw of a fresh draft from an informed
    q (draft_init="above-p"), independent of the step's acceptance and sampling uniforms (lanes 0 and 1).

    Shape: seed [1] or [B], offset [1] or [B] (row b uses offset[b]), positions [B].
    """
    batch = positions.numel()
    k0, k1, row_id = _seed_key(seed, batch)
    offset = _row_offsets(offset, batch)
    pos = _absolute_positions(positions, length)
    lane3 = philox4x32(pos, row_id[:, None], offset & _MASK32, (offset >> 32) & _MASK32, k0[:, None], k1[:, None])[3]
    return uniform_from_bits(lane3)


def gumbel_uniforms(seed: torch.Tensor, positions: torch.Tensor, length: int, vocab: int) -> torch.Tensor:
    """[B, L, V] float32 uniforms of the gumbel stream (independent of the step offset)."""
    batch = positions.numel()
    k0, k1, row_id = _seed_key(seed, batch)
    pos = _absolute_positions(positions, length)
    token = torch.arange(vocab, dtype=torch.int64, device=positions.device)
    lanes = philox4x32(
        (token >> 2)[None, None, :],
        pos[:, :, None],
        row_id[:, None, None],
        GUMBEL_STREAM_TAG,
        k0[:, None, None],
        k1[:, None, None],
    )
    lane_of_token = (token & 3).expand(batch, length, vocab)
    bits = torch.stack(lanes, dim=-1).gather(-1, lane_of_token.unsqueeze(-1)).squeeze(-1)
    return uniform_from_bits(bits)


# --------------------------------------------------------------------------------------------------------------------
# The tree stream (draft trees)
# --------------------------------------------------------------------------------------------------------------------
def _tree_words(seed: torch.Tensor, offset: torch.Tensor, batch: int):
    k0, k1, row_id = _seed_key(seed, batch)
    offset = _row_offsets(offset, batch)[:, 0]
    return k0, k1, offset & _MASK32, TREE_STREAM_TAG | (row_id & 0x3FFFFFFF)


def tree_uniforms(seed: torch.Tensor, offset: torch.Tensor, batch: int, slots: int):
    """(u_accept, u_sample) [B, S] float32 of the tree stream: counter (slot, 2^31, offset_lo, TAG | row_id).

    u_accept[b, s] tests slot s as a candidate; u_sample[b, s] draws the token emitted below slot s. Keyed by the
    row's attempt count, not by position: a batched row equals the row alone (per-row seeds)."""
    k0, k1, off, tag = (w[:, None] for w in _tree_words(seed, offset, batch))
    slot = torch.arange(slots, dtype=torch.int64, device=k0.device)[None, :]
    lane0, lane1, _, _ = philox4x32(slot, 0x80000000, off, tag, k0, k1)
    return uniform_from_bits(lane0), uniform_from_bits(lane1)


def tree_gumbel_uniforms(seed: torch.Tensor, offset: torch.Tensor, batch: int, levels: int, vocab: int,
                         first: int = 0):
    """[B, levels - first, V] float32 uniforms of the tree stream for the sibling candidates of levels first ..
    levels - 1: counter (v >> 2, level, offset_lo, TAG | row_id), lane v & 3."""
    k0, k1, off, tag = (w[:, None, None] for w in _tree_words(seed, offset, batch))
    token = torch.arange(vocab, dtype=torch.int64, device=k0.device)
    level = torch.arange(first, levels, dtype=torch.int64, device=k0.device)
    lanes = philox4x32((token >> 2)[None, None, :], level[None, :, None], off, tag, k0, k1)
    bits = torch.stack(lanes, -1).gather(-1, (token & 3).expand(batch, levels - first, vocab)[..., None]).squeeze(-1)
    return uniform_from_bits(bits)
