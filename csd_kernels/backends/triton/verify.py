"""Triton backend of CSD verification: the launcher. It checks nothing (``ops.verify`` did), picks a path, launches.

The maths is :mod:`csd_kernels.reference` (``verify(..., compute_dtype=torch.float32)``); the kernels in
:mod:`.kernels` only change *how* it is computed. Three paths, chosen by :func:`plan`:

* ``split`` (``kernels/split.py``): S programs per (row, position), each on one slice of the vocabulary, two
  launches. The default: one program per position leaves most SMs idle at the small batches of image generation
  and walks thousands of elements in sequence.
* ``register`` (``kernels/register.py``): one program per (row, position) holding the row in registers
  (V <= 16384): one HBM read, then a per-row epilogue launch. For top-k sampling (its exact k-th-largest bisection
  needs the whole row in one program).
* ``chunked`` (``kernels/chunked.py``): one program per position streaming the row in chunks, for top-k above
  V = 16384.

FMA contraction is off (``enable_fp_fusion=False``) so the fp32 mix ``u + s·(c − u)`` rounds as in the reference.
Compiled code uses approximate exp and division (``ex2.approx``, ``div.full``), the interpreter and the CPU backend
IEEE maths: decisions can differ only when u lies within rounding of a(x) or of a CDF boundary (the measured rate:
docs/measurements.md).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import struct
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch

from ...config.acceptance import RULES
from ..spec import OpSettings, VerifyArgs, settings_of

try:  # pragma: no cover - exercised by whichever environment imports us
    import triton

    from .kernels import chunked, common, register, split
    from .launch import launch

    _TRITON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover
    triton = None
    _TRITON_ERROR = f"{type(exc).__name__}: {exc}"

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
SORTS_ROW = frozenset(rule.code for rule in RULES if rule.sorts_row)  # one program must hold the row

REGISTER_MAX_BLOCK = 16384  # largest V kept entirely in registers (one HBM read)
CHUNK_V = 4096  # chunk of the chunked path
SPLIT_BLOCK = 1024  # tokens per program of the split path (fastest slice at B = 1..64, V = 16384 on an H200)
SPLIT_MAX_SLICES = 256  # larger vocabularies get larger slices
REFERENCE_SM_COUNT = 132  # an H100/H200: the plan used off-GPU (the interpreter), so CPU tests take the GPU's path

__all__ = ["verify_triton", "is_available", "plan", "Plan", "REGISTER_MAX_BLOCK", "CHUNK_V", "device_guard", "fp32",
           "pow2", "register_num_warps", "KernelSettings", "kernel_settings"]


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


def pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def register_num_warps(block: int) -> int:
    """Warps of the register and chunked paths (registers and spills per block: benchmarks/triton_sm90.py)."""
    return 4 if block <= 1024 else 8 if block <= 2048 else 16


@functools.lru_cache(maxsize=4096)  # a pure function of its arguments, asked on every call
def plan(positions: int, vocab: int, top_k: bool, sm_count: int = REFERENCE_SM_COUNT) -> Plan:
    """The path for ``positions`` = B·L rows of ``vocab`` tokens (``top_k``: a top-k restriction is active).

    Split unless top-k needs the whole row in one program: on an H200 at V = 16384 the split path with 1024-token
    slices beat the register path at every batch measured (B = 1 to 64, L = 16; docs/measurements.md). ``positions`` and
    ``sm_count`` are kept for plans that depend on them.
    """
    register_block = max(16, pow2(vocab))
    if top_k:
        if register_block <= REGISTER_MAX_BLOCK:
            return Plan("register", register_block, register_num_warps(register_block))
        return Plan("chunked", CHUNK_V, register_num_warps(CHUNK_V))
    block = min(max(SPLIT_BLOCK, pow2(-(-vocab // SPLIT_MAX_SLICES))), register_block)
    return Plan("split", block, 4 if block <= 2048 else 8)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return REFERENCE_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=1024)  # asked every call with the same few temperatures / top_p / min_p
def fp32(value: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


class KernelSettings(NamedTuple):
    """The call's settings (backends/spec.OpSettings) as every Triton kernel takes them: one argument ``st``, read
    ``st.<field>`` (a tuple to Triton: its scalars are kernel arguments, no device memory)."""

    cfg_scale: float
    inv_t: float  # 1/T rounded to fp32 once, as the reference (1.0 when greedy)
    top_k: int
    top_p: float  # rounded to fp32
    log_min_p: float  # ln(min_p) rounded to fp32, as the reference (-inf: no restriction)
    max_distortion: float  # rounded to fp32 (inf: no cap)
    params: tuple  # the rule's parameters, as many as it declares (rules.py)


@functools.lru_cache(maxsize=256)  # a pure function of a hashable record, asked on every call
def kernel_settings(st: OpSettings) -> KernelSettings:
    greedy = st.temperature == 0
    return KernelSettings(float(st.cfg_scale), 1.0 if greedy else fp32(1.0 / st.temperature), int(st.top_k),
                          fp32(st.top_p), fp32(math.log(st.min_p)) if st.min_p > 0 else float("-inf"),
                          fp32(st.max_distortion), tuple(float(v) for v in st.rule_params))


def verify_triton(a: VerifyArgs, packed_outputs: bool = False):
    """Triton verification step on validated arguments (backends/spec.py; see module docstring); no host
    synchronisation.

    Returns (accept_len int32 [B], tokens int64 [B, L], probs float32 [B, L, V] or an empty (0,) tensor,
    entropy, tvd, accept_prob, distortion float32 [B, L], status int32 [B]).
    ``a.seed`` / ``a.offset``: int64 tensors of 1 or B elements, or a signed int64 word passed as a kernel argument.
    ``packed_outputs``: the four [B, L] statistics are views of one allocation and accept_len / status of another
    (fewer allocations per eager call); the registered op keeps them separate (its outputs may not alias).
    """
    if triton is None:  # pragma: no cover
        raise RuntimeError(f"triton is not importable ({_TRITON_ERROR})")
    B, L, V = a.target_logits.shape
    st = settings_of(a)
    device = a.target_logits.device
    out = _allocate_outputs(B, L, V, device, st.return_probs, packed_outputs)
    if B * L == 0:
        out["accept_len"].fill_(L)
        out["status"].zero_()
    else:
        greedy, top_k = st.temperature == 0, int(st.top_k)
        has_q = a.draft_probs is not None
        seed, offset, start, positions = _flat(a.seed), _flat(a.offset), _flat(a.start), _flat(a.positions)
        seed_value, offset_value = not isinstance(seed, torch.Tensor), not isinstance(offset, torch.Tensor)
        per_row_seed = not seed_value and seed.numel() != 1
        # tuples, named (_FLAG_NAMES, _NUCLEUS_NAMES) only when a key's launches are first prepared
        informed = None if a.informed is None else a.informed.view(torch.uint8)  # a byte per slot
        flags = (a.uncond_logits is not None, has_q, greedy, int(st.rule), int(st.coupling), bool(st.return_probs),
                 per_row_seed, seed_value, offset_value, bool(st.gather_distortion), informed is not None)
        # top-k, top-p, min-p and target probabilities take the per-position paths
        nucleus = ((not greedy) and st.top_p < 1.0, (not greedy) and st.min_p > 0.0, bool(st.target_is_probs))
        whole_row = ((not greedy) and 0 < top_k < V) or True in nucleus or int(st.rule) in SORTS_ROW
        key = _launch_key(a.target_logits, a.uncond_logits, a.draft_probs, a.draft_tokens, start, positions, seed,
                          offset, a.neighbours, top_k, flags, nucleus, informed)
        work = _workspace(key, B, L, V, whole_row, device, int(st.rule) in SORTS_ROW)
        nb = a.neighbours if a.neighbours is not None else start  # never read without a table
        args = _Args(
            a.target_logits, a.uncond_logits if a.uncond_logits is not None else a.target_logits,
            a.draft_probs if has_q else out["ent"], a.draft_tokens, start, positions, seed, offset,
            informed if informed is not None else a.draft_tokens,  # never read without the mask
            q_strides=tuple(a.draft_probs.stride()) if has_q else (0, 0, 0),
            seed_stride=seed.stride(0) if per_row_seed else 0,
            offset_stride=offset.stride(0) if not offset_value and offset.numel() != 1 else 0,
            st=kernel_settings(st),
            flag_values=flags,
            rule=(nb, nb.stride(0) if a.neighbours is not None else 0,
                  a.neighbours.shape[1] if a.neighbours is not None else 0),
        )
        with device_guard(device):  # launch on the tensors' device, not the current one
            if work.plan.path == "split":
                _launch_split(work, args, out, top_k)
            else:
                _launch_per_position(work, args, out, top_k, nucleus)
    o = out
    return o["accept_len"], o["tokens"], o["probs"], o["ent"], o["tvd"], o["acc"], o["dist"], o["status"]


def _flat(t):
    """A 1-D view of an index / word tensor (ops.verify gives [B] or [1]; the registered op may get [] too)."""
    return t if not isinstance(t, torch.Tensor) or t.dim() == 1 else t.reshape(-1)


def _allocate_outputs(B: int, L: int, V: int, device: torch.device, return_probs: bool, packed: bool) -> dict:
    f32, i32 = torch.float32, torch.int32
    out = dict(probs=torch.empty((B, L, V) if return_probs else (0,), dtype=f32, device=device),
               tokens=torch.empty((B, L), dtype=torch.int64, device=device))
    if packed:
        out["ent"], out["tvd"], out["acc"], out["dist"] = torch.empty((4, B, L), dtype=f32, device=device).unbind(0)
        out["accept_len"], out["status"] = torch.empty((2, B), dtype=i32, device=device).unbind(0)
    else:  # a custom op's outputs may not alias one another
        f32, i32 = dict(dtype=f32, device=device), dict(dtype=i32, device=device)
        out.update(ent=torch.empty((B, L), **f32), tvd=torch.empty((B, L), **f32), acc=torch.empty((B, L), **f32),
                   dist=torch.empty((B, L), **f32), accept_len=torch.empty((B,), **i32),
                   status=torch.empty((B,), **i32))
    return out


_FLAG_NAMES = ("HAS_UNCOND", "HAS_Q", "GREEDY", "RULE", "COUPLING", "RETURN_PROBS", "PER_ROW_SEED", "SEED_VALUE",
               "OFFSET_VALUE", "GATHER_DIST", "HAS_INFORMED")
_NUCLEUS_NAMES = ("TOP_P", "MIN_P", "PROBS")


def _launch_key(logits, uncond, q, drafts, start, positions, seed, offset, neighbours, top_k: int, flags: tuple,
                nucleus: tuple, informed=None) -> tuple:
    """What the launches are specialized on (see launch.py), cheaply: the device, the float inputs' dtypes, the
    strides of every input, the 16-byte alignment of every input pointer, the integer top_k and the constexpr flags.
    Every other integer argument and every workspace pointer derives from these (ops.verify fixed the shapes of the
    other inputs against target_logits, and start / positions / seed / offset are int64). A new integer or constexpr
    kernel argument must be added here."""
    aligned = (logits.data_ptr() & 15, drafts.data_ptr() & 15, start.data_ptr() & 15, positions.data_ptr() & 15)
    return (logits.device, logits.dtype, logits.shape, logits.stride(),
            None if uncond is None else (uncond.dtype, uncond.stride(), uncond.data_ptr() & 15),
            None if q is None else (q.stride(), q.data_ptr() & 15),
            drafts.dtype, drafts.stride(), start.stride(), positions.stride(), _word_key(seed), _word_key(offset),
            None if neighbours is None else (neighbours.stride(), neighbours.shape[1], neighbours.data_ptr() & 15),
            aligned, top_k, flags, nucleus, None if informed is None else (informed.stride(), informed.data_ptr() & 15))


def _word_key(word) -> tuple:
    """A seed / offset's share of the launch key: a tensor's stride and alignment, or an int's Triton type (i32 when
    it fits, else i64; its value is never specialized on, see common.py)."""
    if isinstance(word, torch.Tensor):
        return word.stride(), word.data_ptr() & 15
    return (-(1 << 31) <= word < (1 << 31),)


@dataclass
class _Workspace:
    """Per launch key: the plan and the scratch the kernels write before they read it (reused call after call)."""

    plan: Plan
    scratch: torch.Tensor  # [3, B, L] int32 per position: resampled token, later draw, flags
    stats: Optional[torch.Tensor] = None  # split path: per-program statistics, sums, indices, counters
    sums: Optional[torch.Tensor] = None
    ints: Optional[torch.Tensor] = None
    gsd: Optional[torch.Tensor] = None  # gsd's scratch, 4·block + 2 floats per position (register path)
    inputs: Optional[list] = None  # the shared leading kernel arguments of the key's first call (strides fixed)
    consts: Optional[dict] = None  # the path's grids, workspace views and constexprs
    kernels: dict = field(default_factory=dict)  # the compiled kernels of this key (launch.launch's cache)


_WORKSPACES: dict = {}  # never evicted: a captured CUDA graph may still write a workspace it saw


def _stream(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(index)  # what Triton launches on, without building a Stream object


def _workspace(key: tuple, B: int, L: int, V: int, top_k: bool, device: torch.device, gsd: bool = False) -> _Workspace:
    """The cached workspace of ``key`` and its plan on the current stream (a stream's launches run in order, so one
    buffer per stream is never read and written by two calls at once). The plan is asked every call, so that a
    replaced ``plan`` (the tests force each path) gets its own workspace and kernels."""
    chosen = plan(B * L, V, top_k, _sm_count(device))
    stream = _stream(device)
    work = _WORKSPACES.get((key, chosen, stream))
    if work is None:
        work = _WORKSPACES[(key, chosen, stream)] = _Workspace(chosen, torch.empty((3, B, L), dtype=torch.int32,
                                                                                   device=device))
        if chosen.path == "split":
            programs = B * L * -(-V // chosen.block)
            assert split.N_STATS.value == split.N_SUMS.value
            work.stats, work.sums = torch.empty((2, programs, split.N_STATS.value), dtype=torch.float32,
                                                device=device)  # contiguous
            work.ints = torch.empty((programs * 3 + B * L + B,), dtype=torch.int32, device=device)
        if gsd:
            if chosen.path != "register":
                raise RuntimeError(f"the triton backend runs gsd for vocabularies up to {REGISTER_MAX_BLOCK} (its row "
                                   f"sorted in one program), not V = {V}: use the cuda, cpu or torch backend")
            work.gsd = torch.empty((B * L * (4 * chosen.block + 2),), dtype=torch.float32, device=device)
    return work


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
    informed: torch.Tensor  # [B, L] uint8 (any int tensor without the mask: never read)
    q_strides: tuple
    seed_stride: int
    offset_stride: int
    st: KernelSettings
    flag_values: tuple  # the constexpr switches both paths share, in _FLAG_NAMES order
    rule: tuple  # the neighbour table (any int64 tensor without one), its row stride, its k

    @property
    def flags(self) -> dict:
        return dict(zip(_FLAG_NAMES, self.flag_values))

    def inputs(self, work: _Workspace) -> list:
        """The leading kernel arguments both paths share, in kernel order: the key's strides, this call's tensors."""
        if work.inputs is None:
            work.inputs = [
                self.logits, self.logits.stride(0), self.logits.stride(1),
                self.uncond, self.uncond.stride(0), self.uncond.stride(1),
                self.q, *self.q_strides,
                self.drafts, self.drafts.stride(0), self.drafts.stride(1),
                self.start, self.start.stride(0), self.positions, self.positions.stride(0),
                self.seed, self.seed_stride, self.offset, self.offset_stride,
                self.informed, *(self.informed.stride() if self.flags["HAS_INFORMED"] else (0, 0)),
            ]
        args = list(work.inputs)
        args[0], args[3], args[6], args[10] = self.logits, self.uncond, self.q, self.drafts
        args[13], args[15], args[17], args[19], args[21] = (self.start, self.positions, self.seed, self.offset,
                                                            self.informed)
        return args


def _outputs(out: dict, scratch: tuple) -> tuple:
    return (out["probs"], out["ent"], out["tvd"], out["acc"], out["dist"], *scratch)


def first_stop_launch(flags: dict) -> bool:
    """gsd decided from the draft's own group (its distortion not asked): a second launch of the position kernel
    (GSD_ROWS) draws each row's first stop from the sorted row."""
    return flags["RULE"] in SORTS_ROW and not flags["GATHER_DIST"]


def _launch_per_position(work: _Workspace, a: _Args, out, top_k, nucleus_flags=(False, False, False)):
    B, L, V = a.logits.shape
    c = work.consts
    if c is None:
        chosen = work.plan
        c = work.consts = dict(
            kernel=register.position_kernel if chosen.path == "register" else chunked.position_chunked_kernel,
            scratch=tuple(work.scratch.unbind(0)), num_warps=chosen.num_warps,
            constexprs=dict(TOP_K=(not a.flags["GREEDY"]) and 0 < top_k < V, BLOCK_V=chosen.block, **a.flags,
                            **dict(zip(_NUCLEUS_NAMES, nucleus_flags))),
            finalize_constexprs=dict(BLOCK_L=max(16, pow2(L))),
            drafts_strides=(a.drafts.stride(0), a.drafts.stride(1)),
        )
        if first_stop_launch(a.flags):  # its own kernel cache: another specialization
            c["gsd_rows"] = ({}, dict(c["constexprs"], GSD_ROWS=True))
    scratch = c["scratch"]
    args = (*a.inputs(work), *_outputs(out, scratch), L, V, a.st, *a.rule,
            work.gsd if work.gsd is not None else a.logits)
    launch(c["kernel"], (B * L,), work.kernels, args, c["constexprs"], num_warps=c["num_warps"],
           enable_fp_fusion=False)
    if "gsd_rows" in c:
        rows_cache, rows_constexprs = c["gsd_rows"]
        launch(c["kernel"], (B,), rows_cache, args, rows_constexprs, num_warps=c["num_warps"], enable_fp_fusion=False)
    launch(common.finalize_kernel, (B,), work.kernels,
           (a.drafts, *c["drafts_strides"], *scratch, out["tokens"], out["accept_len"], out["status"], L, V),
           c["finalize_constexprs"], num_warps=1)


def _split_constants(work: _Workspace, a: _Args) -> dict:
    """What a split launch under this key always passes: grid, workspace views, strides, constexprs."""
    B, L, V = a.logits.shape
    chosen, flags = work.plan, a.flags
    n_split = -(-V // chosen.block)
    programs = B * L * n_split
    ints = work.ints
    return dict(
        grid=(programs,), num_warps=chosen.num_warps, scratch=tuple(work.scratch.unbind(0)),
        stats=(work.stats, ints[: 2 * programs], ints[3 * programs: 3 * programs + B * L], ints[3 * programs + B * L:]),
        bad_q=ints[2 * programs: 3 * programs],
        strides=(a.logits.stride(0), a.logits.stride(1), a.uncond.stride(0), a.uncond.stride(1),
                 a.positions.stride(0)),
        stats_constexprs=dict(HAS_UNCOND=flags["HAS_UNCOND"], GREEDY=flags["GREEDY"],
                              GUMBEL=flags["COUPLING"] == 2 and not flags["GREEDY"],
                              PER_ROW_SEED=flags["PER_ROW_SEED"], BLOCK_V=chosen.block,
                              SEED_VALUE=flags["SEED_VALUE"]),
        finish_constexprs=dict(**flags, BLOCK_V=chosen.block, S_BLOCK=max(2, pow2(n_split)),
                               BLOCK_L=max(16, pow2(L))),
    )


def _launch_split(work: _Workspace, a: _Args, out, top_k):
    B, L, V = a.logits.shape
    c = work.consts
    if c is None:
        c = work.consts = _split_constants(work, a)
    (s_cb, s_cl, s_ub, s_ul, s_pos), (stats, index, position_count, row_count) = c["strides"], c["stats"]
    launch(split.split_stats_kernel, c["grid"], work.kernels,
           (a.logits, s_cb, s_cl, a.uncond, s_ub, s_ul, a.positions, s_pos, a.seed, a.seed_stride,
            stats, index, position_count, row_count, L, V, a.st),
           c["stats_constexprs"], num_warps=c["num_warps"], enable_fp_fusion=False)
    launch(split.split_finish_kernel, c["grid"], work.kernels,
           (*a.inputs(work), *_outputs(out, c["scratch"]),
            stats, index, work.sums, c["bad_q"], position_count, row_count, out["tokens"], out["accept_len"],
            out["status"], L, V, a.st, *a.rule),
           c["finish_constexprs"], num_warps=c["num_warps"], enable_fp_fusion=False)
