"""Triton backend of CSD verification: the launcher. It checks nothing (``ops.verify`` did), picks a path, launches.

The maths is :mod:`csd_kernels.reference` (``verify(..., compute_dtype=torch.float32)``); the kernels in
:mod:`csd_kernels.triton_kernels` only change *how* it is computed. Three paths, chosen by :func:`plan`:

* ``split`` (``triton_kernels/split.py``): S programs per (row, position), each on one slice of the vocabulary, two
  launches. The default: one program per position leaves most SMs idle at the small batches of image generation
  and walks thousands of elements in sequence.
* ``register`` (``triton_kernels/register.py``): one program per (row, position) holding the row in registers
  (V <= 16384): one HBM read, then a per-row epilogue launch. For top-k sampling (its exact k-th-largest bisection
  needs the whole row in one program).
* ``chunked`` (``triton_kernels/chunked.py``): one program per position streaming the row in chunks, for top-k above
  V = 16384.

FMA contraction is off (``enable_fp_fusion=False``) so the fp32 mix ``u + s·(c − u)`` rounds as in the reference.
Compiled code uses approximate exp and division (``ex2.approx``, ``div.full``), the interpreter and the CPU backend
IEEE maths: decisions can differ only when u lies within rounding of a(x) or of a CDF boundary (see the README for
the measured rate).
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct
from dataclasses import dataclass
from typing import Optional

import torch

try:  # pragma: no cover - exercised by whichever environment imports us
    import triton

    from .triton_kernels import chunked, common, register, split

    _TRITON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover
    triton = None
    _TRITON_ERROR = f"{type(exc).__name__}: {exc}"

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

REGISTER_MAX_BLOCK = 16384  # largest V kept entirely in registers (one HBM read)
CHUNK_V = 4096  # chunk of the chunked path
SPLIT_BLOCK = 1024  # tokens per program of the split path (fastest slice at B = 1..64, V = 16384 on an H200)
SPLIT_MAX_SLICES = 256  # larger vocabularies get larger slices
REFERENCE_SM_COUNT = 132  # an H100/H200: the plan used off-GPU (the interpreter), so CPU tests take the GPU's path

__all__ = ["verify_triton", "is_available", "plan", "Plan", "REGISTER_MAX_BLOCK", "CHUNK_V"]


def is_available(device) -> tuple[bool, str]:
    """(usable, reason) for tensors on ``device``; reason is "" when usable, else how to make it usable."""
    if triton is None:
        return False, f"triton is not importable ({_TRITON_ERROR}); install triton"
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "torch.cuda is not available; use a CUDA build of torch with a GPU"
        return True, "triton on CUDA"
    if device.type == "cpu":
        if _INTERPRET:
            return True, ""
        return False, ("CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before importing "
                       "triton/csd_kernels")
    return False, f"device type {device.type!r} is not supported by the triton backend"


@dataclass(frozen=True)
class Plan:
    """How one call runs: the path, the vocabulary block per program, warps per program."""

    path: str  # "split" | "register" | "chunked"
    block: int
    num_warps: int


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def register_num_warps(block: int) -> int:
    """Warps of the register and chunked paths (registers and spills per block: benchmarks/triton_sm90.py)."""
    return 4 if block <= 1024 else 8 if block <= 2048 else 16


def plan(positions: int, vocab: int, top_k: bool, sm_count: int = REFERENCE_SM_COUNT) -> Plan:
    """The path for ``positions`` = B·L rows of ``vocab`` tokens (``top_k``: a top-k restriction is active).

    Split unless top-k needs the whole row in one program: on an H200 at V = 16384 the split path with 1024-token
    slices beat the register path at every batch measured (B = 1 to 64, L = 16; README). ``positions`` and
    ``sm_count`` are kept for plans that depend on them.
    """
    register_block = max(16, _pow2(vocab))
    if top_k:
        if register_block <= REGISTER_MAX_BLOCK:
            return Plan("register", register_block, register_num_warps(register_block))
        return Plan("chunked", CHUNK_V, register_num_warps(CHUNK_V))
    block = min(max(SPLIT_BLOCK, _pow2(-(-vocab // SPLIT_MAX_SLICES))), register_block)
    return Plan("split", block, 4 if block <= 2048 else 8)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return REFERENCE_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


def _fp32(value: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def verify_triton(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    uncond_logits: Optional[torch.Tensor],
    cfg_scale: float,
    temperature: float,
    top_k: int,
    rule: int,
    entropy_coef: float,
    tvd_threshold: float,
    start: torch.Tensor,
    coupling: int,
    positions: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_probs: bool,
):
    """Triton verification step on validated arguments (see module docstring); no host synchronisation.

    Returns (accept_len int32 [B], tokens int64 [B, L], probs float32 [B, L, V] or an empty (0,) tensor,
    entropy, tvd, accept_prob, distortion float32 [B, L], status int32 [B]).
    """
    if triton is None:  # pragma: no cover
        raise RuntimeError(f"triton is not importable ({_TRITON_ERROR})")
    B, L, V = target_logits.shape
    device = target_logits.device
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    # the outputs are separate tensors: a custom op's outputs may not alias one another
    out = dict(
        probs=torch.empty((B, L, V) if return_probs else (0,), **f32),
        ent=torch.empty((B, L), **f32), tvd=torch.empty((B, L), **f32), acc=torch.empty((B, L), **f32),
        dist=torch.empty((B, L), **f32), tokens=torch.empty((B, L), dtype=torch.int64, device=device),
        accept_len=torch.empty((B,), **i32), status=torch.empty((B,), **i32),
    )
    scratch = torch.empty((3, B, L), **i32)  # per position: resampled token, later draw, flags
    if B * L == 0:
        out["accept_len"].fill_(L)
        out["status"].zero_()
    else:
        greedy = temperature == 0
        chosen = plan(B * L, V, (not greedy) and 0 < top_k < V, _sm_count(device))
        has_q = draft_probs is not None
        seed, offset = seed.reshape(-1), offset.reshape(-1)
        args = _Args(
            target_logits, uncond_logits if uncond_logits is not None else target_logits,
            draft_probs if has_q else out["ent"], draft_tokens, start.reshape(-1), positions.reshape(-1), seed, offset,
            q_strides=tuple(draft_probs.stride()) if has_q else (0, 0, 0),
            seed_stride=seed.stride(0) if seed.numel() != 1 else 0,
            offset_stride=offset.stride(0) if offset.numel() != 1 else 0,
            scalars=(float(cfg_scale), _fp32(1.0 / temperature) if not greedy else 1.0),  # 1/T rounded once, as ref
            flags=dict(HAS_UNCOND=uncond_logits is not None, HAS_Q=has_q, GREEDY=greedy,
                       CSD_RULE=int(rule) == 1, COUPLING=int(coupling), RETURN_PROBS=bool(return_probs),
                       PER_ROW_SEED=seed.numel() != 1),
        )
        launch = _launch_split if chosen.path == "split" else _launch_per_position
        with device_guard(device):  # launch on the tensors' device, not the current one
            launch(chosen, args, out, scratch, int(top_k), float(entropy_coef), float(tvd_threshold))
    o = out
    return o["accept_len"], o["tokens"], o["probs"], o["ent"], o["tvd"], o["acc"], o["dist"], o["status"]


def device_guard(device: torch.device):
    """torch.cuda.device(device) for CUDA tensors (Triton launches on the current device), else a no-op."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@dataclass
class _Args:
    logits: torch.Tensor
    uncond: torch.Tensor  # the logits again when there is no CFG (never read)
    q: torch.Tensor  # any float tensor when there is no draft_probs (never read)
    drafts: torch.Tensor
    start: torch.Tensor
    positions: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor
    q_strides: tuple
    seed_stride: int
    offset_stride: int
    scalars: tuple  # cfg_scale, 1/T
    flags: dict  # the constexpr switches both paths share

    def inputs(self) -> tuple:
        """The leading kernel arguments both paths share, in kernel order."""
        return (
            self.logits, self.logits.stride(0), self.logits.stride(1),
            self.uncond, self.uncond.stride(0), self.uncond.stride(1),
            self.q, *self.q_strides,
            self.drafts, self.drafts.stride(0), self.drafts.stride(1),
            self.start, self.start.stride(0), self.positions, self.positions.stride(0),
            self.seed, self.seed_stride, self.offset, self.offset_stride,
        )


def _outputs(out: dict, scratch: torch.Tensor) -> tuple:
    return (out["probs"], out["ent"], out["tvd"], out["acc"], out["dist"], scratch[0], scratch[1], scratch[2])


def _launch_per_position(chosen: Plan, a: _Args, out, scratch, top_k, entropy_coef, tvd_threshold):
    B, L, V = a.logits.shape
    kernel = register.position_kernel if chosen.path == "register" else chunked.position_chunked_kernel
    kernel[(B * L,)](
        *a.inputs(), *_outputs(out, scratch),
        L, V, *a.scalars, top_k, entropy_coef, tvd_threshold,
        TOP_K=(not a.flags["GREEDY"]) and 0 < top_k < V, BLOCK_V=chosen.block, **a.flags,
        num_warps=chosen.num_warps, enable_fp_fusion=False,
    )
    common.finalize_kernel[(B,)](
        a.drafts, a.drafts.stride(0), a.drafts.stride(1), scratch[0], scratch[1], scratch[2],
        out["tokens"], out["accept_len"], out["status"], L, V, BLOCK_L=max(16, _pow2(L)), num_warps=1,
    )


def _launch_split(chosen: Plan, a: _Args, out, scratch, top_k, entropy_coef, tvd_threshold):
    B, L, V = a.logits.shape
    n_split = -(-V // chosen.block)
    programs = B * L * n_split
    device = a.logits.device
    assert split.N_STATS.value == split.N_SUMS.value
    stats, sums = torch.empty((2, programs, split.N_STATS.value), dtype=torch.float32, device=device)  # contiguous
    ints = torch.empty((programs * 3 + B * L + B,), dtype=torch.int32, device=device)
    index, bad_q = ints[: 2 * programs], ints[2 * programs: 3 * programs]
    position_count, row_count = ints[3 * programs: 3 * programs + B * L], ints[3 * programs + B * L:]
    flags = a.flags
    split.split_stats_kernel[(programs,)](
        a.logits, a.logits.stride(0), a.logits.stride(1), a.uncond, a.uncond.stride(0), a.uncond.stride(1),
        a.positions, a.positions.stride(0), a.seed, a.seed_stride,
        stats, index, position_count, row_count, L, V, *a.scalars,
        HAS_UNCOND=flags["HAS_UNCOND"], GREEDY=flags["GREEDY"],
        GUMBEL=flags["COUPLING"] == 2 and not flags["GREEDY"], PER_ROW_SEED=flags["PER_ROW_SEED"],
        BLOCK_V=chosen.block, num_warps=chosen.num_warps, enable_fp_fusion=False,
    )
    split.split_finish_kernel[(programs,)](
        *a.inputs(), *_outputs(out, scratch),
        stats, index, sums, bad_q, position_count, row_count, out["tokens"], out["accept_len"], out["status"],
        L, V, *a.scalars, entropy_coef, tvd_threshold, **flags,
        BLOCK_V=chosen.block, S_BLOCK=max(2, _pow2(n_split)), BLOCK_L=max(16, _pow2(L)),
        num_warps=chosen.num_warps, enable_fp_fusion=False,
    )
