"""Speculative Jacobi decoding of AR image generators: ``generate(model, input_ids, mode=...)``.

Each iteration drafts a window of W grid tokens per row, runs the model once on the last committed token and the
drafts, verifies the window (by mode: ar, jd, sjd, gsd, csd), commits the accepted prefix plus the resampled token and
keeps the rest as the next drafts (their q = this iteration's p). Rows keep their own windows and random streams
(keyed by seed, grid position and the row's own attempt count), so a batched row equals the row alone; rows more than
``max_lead`` tokens ahead of the slowest sit an iteration out, bounding the forward to max_lead + W tokens. One host
sync per iteration (accept_len). See docs/decoding.md for the modes, the couplings and the counting.
``static=True`` runs the fixed-shape, sync-free form of the same iteration instead (static.py, docs/fast-path.md).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np
import torch

from .. import reference as ref
from ..models import get_adapter
from ..models.protocol import is_static_adapter, is_tree_adapter
from ..ops.verify_tree import device_layout
from ..reference.gsd import DEFAULT_GROUP_DELTA, DEFAULT_GROUP_RANK
from .state import RowState
from .static import StaticLoop, StaticState
from .steps import VERIFY, Settings, commit, draft_probs, draft_window, forward
from .tree import tree_step
from .validation import (
    DRAFT_INITS,
    MODES,
    check_backend,
    check_generate,
    check_prompt,
    check_prompt_ids,
    check_tree,
    row_seeds,
)

__all__ = ["MODES", "COUPLINGS", "DEFAULT_COUPLING", "DRAFT_INITS", "GenerateOutput", "generate"]

COUPLINGS = ref.COUPLINGS  # how sjd / csd draw the next drafts; ar, jd and gsd draw them independently
DEFAULT_COUPLING = "maximal"  # lossless-tested like the others, and the fewest passes (docs/decoding.md)
DEFAULT_MAX_LEAD_FACTOR = 1  # max_lead=None means one window (the trade-off: docs/measurements.md)


@dataclass
class GenerateOutput:
    tokens: torch.Tensor  # [B, H*W] int64 grid ids, raster order
    images: Optional[torch.Tensor]  # [B, H_px, W_px, 3] uint8, or None without a pixel decoder
    forward_passes: int  # target-model forward calls of the decoding loop (exact; prefill not included)
    prefill_passes: int  # target-model forward calls of the prefill (0 or 1)
    accepted: list  # per forward pass: [B] tokens committed by each row in that pass
    entropy_map: torch.Tensor  # [B, H, W] entropy (nats) of p at each token when it was committed
    accept_map: torch.Tensor  # [B, H, W] acceptance probability of the draft there when committed (0: no draft)
    distortion_map: torch.Tensor  # [B, H, W] ½Σ|out − p| of the committing step (0 = lossless; NaN for jd)
    tvd_map: torch.Tensor  # [B, H, W] TVD(p, q) of the committing step (NaN where there was no draft)
    timings: dict = field(default_factory=dict)  # seconds: model, verify, decode, rest, total
    sequences: Optional[torch.Tensor] = None  # [B, T] the image part in the model's own vocabulary and layout

    def passes_per_row(self) -> np.ndarray:
        """[B] forward passes each row needed: the passes in which it still committed tokens (every row has its own
        window, so this is the count the row would need if generated alone)."""
        return (np.asarray(self.accepted) > 0).sum(0)

    def distortion_per_row(self) -> np.ndarray:
        """[B] mean distortion per token of each row (jd's unknown distortion, NaN in the map, counts as 0)."""
        return torch.nan_to_num(self.distortion_map, nan=0.0).float().mean((1, 2)).cpu().numpy()

    def pil_images(self) -> list:
        """The images as a list of B PIL images (needs Pillow); ValueError when the model has no pixel decoder."""
        if self.images is None:
            raise ValueError("this model has no pixel decoder (images is None); its image tokens are in .sequences")
        from PIL import Image

        return [Image.fromarray(image) for image in self.images.cpu().numpy()]


@torch.no_grad()
def generate(
    model,
    input_ids: Optional[torch.Tensor] = None,
    *,
    prompt_embeds: Optional[torch.Tensor] = None,
    attention_mask: Optional[torch.Tensor] = None,
    mode: str = "csd",
    window: int = 16,
    cfg_scale: float = 5.0,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    min_p: Optional[float] = None,
    entropy_coef: float = 0.5,
    tvd_threshold: float = 0.65,
    draft_init: str = "uniform",
    coupling: Optional[str] = None,
    seed: Union[int, Sequence[int], torch.Tensor] = 0,
    progress: bool = False,
    backend: Optional[str] = None,
    group_rank: int = DEFAULT_GROUP_RANK,
    group_delta: float = DEFAULT_GROUP_DELTA,
    sync_timings: bool = False,
    max_lead: Optional[int] = None,
    static: Optional[bool] = None,
    cuda_graph: Optional[bool] = None,
    compile: bool = False,
    tree: Optional[tuple] = None,
) -> GenerateOutput:
    """Generate images with speculative Jacobi decoding (see the module docstring).

    model: a JanusForConditionalGeneration, a ChameleonForConditionalGeneration (Lumina-mGPT layout), a LlamaGen
    adapter (csd_kernels.models.load_llamagen), an ImageGPT-wrapped causal LM, or any csd_kernels.models.ImageAdapter.
    input_ids [B, S] (left-padded with attention_mask when prompts differ in length), or instead prompt_embeds
    [B, S, C] for adapters that take embedded prompts (they implement ``prefill_embeds``, e.g. LlamaGen t2i caption
    features). seed: int s (row b gets s + b) or B per-row seeds. cfg_scale = 1 runs no unconditional rows.
    coupling: the next drafts of sjd / csd, one of COUPLINGS (None: DEFAULT_COUPLING). group_rank / group_delta: the
    GSD group (k, δ). sync_timings: on CUDA, synchronise around the timed phases (otherwise asynchronous model work is
    attributed to verify, where the loop waits for accept_len). max_lead: rows more than max_lead committed tokens
    ahead of the slowest row pause (None = one window); the tokens do not depend on it, only the pass counts do.
    static: the fixed-shape iteration on a per-row static KV cache, no host sync inside (same tokens and passes
    at B = 1; every row its own window, so max_lead does not apply); None: static with a tree, eager without.
    cuda_graph (static only; None = on for CUDA): capture one iteration in a CUDA graph and replay it. compile
    (static only): the iteration under torch.compile(fullgraph=True). tree (K, D): a draft tree in every window
    (mode sjd or csd, the static loop, the maximal coupling; docs/trees.md): K candidates per position at the first
    D positions, verified by recursive rejection sampling; lossless with sjd, each token with chain csd's law with
    csd.
    """
    batch = check_prompt(input_ids, prompt_embeds, attention_mask)
    coupling = check_generate(mode, coupling, window=window, cfg_scale=cfg_scale, temperature=temperature,
                              top_k=top_k, top_p=top_p, min_p=min_p, entropy_coef=entropy_coef,
                              tvd_threshold=tvd_threshold, draft_init=draft_init, group_rank=group_rank,
                              group_delta=group_delta, max_lead=max_lead)
    tree = check_tree(tree, mode, window, coupling, static)
    static = tree is not None if static is None else static
    coupling = coupling or DEFAULT_COUPLING
    seeds = row_seeds(seed, batch)
    adapter = get_adapter(model)
    cuda_graph = _check_static(adapter, static, cuda_graph, compile, max_lead)
    if tree is not None and not is_tree_adapter(adapter):
        raise ValueError(f"tree={tree}: {type(adapter).__name__} does not run draft trees (the adapter "
                         "protocol's forward_tree(), keep_path() and supports_tree; docs/trees.md)")
    device = adapter.device
    check_backend(backend, device)
    check_prompt_ids(input_ids, getattr(adapter, "prompt_vocab_size", None))
    total = adapter.grid[0] * adapter.grid[1]
    window = 1 if mode == "ar" else (window if tree else min(window, total))  # a tree may run past the grid
    run = Settings(mode, window, total, adapter.grid[1], adapter.vocab_size, cfg_scale, temperature, top_k,
                   entropy_coef, tvd_threshold, draft_init, coupling, backend, group_rank, group_delta,
                   seeds.to(device), temperature > 0 and mode in ("sjd", "csd", "gsd"), top_p=top_p, min_p=min_p,
                   tree=tree)
    lead = DEFAULT_MAX_LEAD_FACTOR * window if max_lead is None else max_lead
    clock = _Clock(device, sync_timings)
    if static:
        if tree is None:
            adapter.static_cache(window)
        else:  # a tree may need more cache slots than a chain (Lumina-mGPT: a forced row end after some nodes)
            adapter.static_cache(window, tree=ref.tree_layout(*tree, window))

    prefill_passes = clock.time("model", lambda: _prefill(adapter, input_ids, prompt_embeds, attention_mask,
                                                          cfg_scale != 1.0))
    if static:
        return _generate_static(adapter, run, batch, prefill_passes, clock, progress, cuda_graph, compile)
    state = RowState.empty(batch, total, window, run.vocab, run.need_q, device)
    bar = _progress_bar(progress, total, mode)
    while not state.done(total):
        win = state.window(lead, window, total)
        drafted = draft_window(state, win, run)
        cond, uncond = clock.time("model", lambda: forward(adapter, state, win, drafted))
        verified, accept_list = clock.time("verify", lambda: _verify(cond, uncond, run, state, win, drafted))
        committed_before = min(state.n)
        commit(state, win, verified, accept_list, run)
        if bar is not None:
            bar.update(min(state.n) - committed_before)
    if bar is not None:
        bar.close()
    images = clock.time("decode", lambda: adapter.decode(state.seq))
    return _output(state, adapter, images, prefill_passes, clock, batch)


def _generate_static(adapter, run: Settings, batch: int, prefill_passes: int, clock: "_Clock", progress: bool,
                     cuda_graph: bool, compile: bool) -> GenerateOutput:
    state = StaticState.empty(batch, run.total, run.window, run.vocab, run.need_q, adapter.device)
    iteration = None
    if run.tree is not None:
        iteration = functools.partial(tree_step, layout=device_layout(*run.tree, run.window, adapter.device))
    loop = StaticLoop(adapter, run, state, cuda_graph=cuda_graph, compile=compile, iteration=iteration)
    bar = _progress_bar(progress, run.total, run.mode)
    clock.time("loop", lambda: loop.run(bar))
    if bar is not None:
        bar.close()
    tokens, maps, accepted, _ = loop.output()
    images = clock.time("decode", lambda: adapter.decode(tokens))
    done = RowState(tokens, maps, [run.total] * batch, state.n[:, None], state.drafted[:, None], [False] * batch,
                    state.attempts, state.q_store, accepted)
    return _output(done, adapter, images, prefill_passes, clock, batch)


def _check_static(adapter, static: bool, cuda_graph: Optional[bool], compile: bool, max_lead) -> bool:
    """Checks the static-loop options; returns whether to capture a CUDA graph."""
    if not static:
        if cuda_graph or compile:
            raise ValueError("cuda_graph and compile apply to static=True only")
        return False
    if not is_static_adapter(adapter):
        raise ValueError(f"static=True needs an adapter with static_cache() and forward_static(); "
                         f"{type(adapter).__name__} has none")
    if max_lead is not None:
        raise ValueError("max_lead applies to static=False (the static loop gives every row its own window)")
    on_cuda = adapter.device.type == "cuda"
    if cuda_graph and not on_cuda:
        raise ValueError(f"cuda_graph=True needs a model on a CUDA device, not {adapter.device}")
    return on_cuda if cuda_graph is None else bool(cuda_graph)


def _verify(cond, uncond, run: Settings, state: RowState, win, drafted):
    """Verification by mode, then the iteration's one host sync: accept_len and the status bits together."""
    verified = VERIFY[run.mode](cond, uncond, draft_probs(state, win, drafted, run), run, state, win, drafted)
    accept_list, status = torch.stack([verified.accept_len.to(torch.int64),
                                       verified.result.status.to(torch.int64)]).tolist()
    if any(s and a for s, a in zip(status, win.active)):
        raise ValueError(f"verification flagged the model's logits or the drafts (status bits {status}; "
                         f"1 = NaN/Inf logits) at grid positions {win.m}..{win.end - 1}")
    return verified, accept_list


def _output(state: RowState, adapter, images, prefill_passes: int, clock: "_Clock", batch: int) -> GenerateOutput:
    grid = (batch, *adapter.grid)
    return GenerateOutput(
        tokens=state.seq, images=images, forward_passes=len(state.accepted), prefill_passes=prefill_passes,
        accepted=state.accepted, entropy_map=state.maps[0].reshape(grid), accept_map=state.maps[1].reshape(grid),
        distortion_map=state.maps[2].reshape(grid), tvd_map=state.maps[3].reshape(grid), timings=clock.summary(),
        sequences=adapter.image_sequence(state.seq),
    )


class _Clock:
    """Seconds spent in named phases (model, verify, decode); the rest is the loop's own overhead."""

    def __init__(self, device: torch.device, sync: bool):
        self.sync = sync and device.type == "cuda"
        self.device = device
        self.seconds = {"model": 0.0, "verify": 0.0, "decode": 0.0}  # (+ "loop": the static loop, all phases)
        self.begin = time.perf_counter()

    def time(self, phase: str, fn):
        t0 = time.perf_counter()
        out = fn()
        if self.sync:
            torch.cuda.synchronize(self.device)
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0
        return out

    def summary(self) -> dict:
        total = time.perf_counter() - self.begin
        return dict(self.seconds, rest=total - sum(self.seconds.values()), total=total)


def _progress_bar(progress: bool, total: int, mode: str):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"csd_kernels {mode}", unit="tok")


# ----------------------------------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------------------------------
def _prefill(adapter, input_ids, prompt_embeds, attention_mask, cfg: bool) -> int:
    if prompt_embeds is None:
        return adapter.prefill(input_ids, attention_mask, cfg)
    if not callable(getattr(adapter, "prefill_embeds", None)):
        raise ValueError(f"{type(adapter).__name__} takes input_ids, not prompt_embeds")
    return adapter.prefill_embeds(prompt_embeds, attention_mask, cfg)
