"""Speculative Jacobi decoding of AR image generators: ``generate(model, input_ids, mode=...)``, the entry point.

Each iteration drafts a window of W grid tokens per row, runs the model once on the last committed token and the
drafts, verifies the window (by mode: ar, jd, or one speculative mode per acceptance rule, config/modes.py), commits
the accepted prefix plus the resampled token and keeps the rest as the next drafts (their q = this iteration's p).
Rows keep their own windows and random streams (keyed by seed, grid position and the row's own attempt count), so a
batched row equals the row alone. The iteration
is written once (step.py); generate() checks the arguments, prefills and runs one of three schedules over it: the
eager loop (eager.py: one host sync per iteration, rows more than ``max_lead`` tokens ahead of the slowest sit an
iteration out), the static loop (static.py, ``static=True``: fixed shapes, no host sync inside, docs/fast-path.md)
or a draft tree in the static loop's window (tree.py, ``tree=(K, D)``, docs/trees.md). See docs/decoding.md for the
modes, the couplings and the counting.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from .. import reference as ref
from ..config.acceptance import default_lantern_k, rule_named
from ..config.generation import DEFAULT_COUPLING, DRAFT_INITS, MODES, GenerationConfig, check_generate, run_label
from ..config.modes import MODE_TABLE
from ..constants import COUPLINGS
from ..models import get_adapter
from ..models.protocol import is_static_adapter, is_tree_adapter
from ..ops.neighbours import model_neighbours
from ..ops.verify_tree import device_layout
from .eager import run_eager
from .state import EagerState, StaticState
from .static import StaticLoop
from .step import Settings
from .tree import tree_step
from .validation import check_backend, check_prompt, check_prompt_ids, check_tree, row_seeds

__all__ = ["MODES", "COUPLINGS", "DEFAULT_COUPLING", "DRAFT_INITS", "GenerateOutput", "GenerationConfig", "generate"]

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
    mode: Optional[str] = None  # the decoding mode that made it

    def passes_per_row(self) -> np.ndarray:
        """[B] forward passes each row needed: the passes in which it still committed tokens (every row has its own
        window, so this is the count the row would need if generated alone)."""
        return (np.asarray(self.accepted) > 0).sum(0)

    def distortion_per_row(self) -> np.ndarray:
        """[B] mean distortion per token of each row. jd's map is NaN (untracked) and counts as 0: every token it
        commits is a fresh sample. A lantern mode's map without gather_distortion is NaN, and so is its mean."""
        dist = self.distortion_map
        if self.mode is None or MODE_TABLE[self.mode].rule is None:
            dist = torch.nan_to_num(dist, nan=0.0)
        return dist.float().mean((1, 2)).cpu().numpy()

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
    config: Optional[GenerationConfig] = None,
    **overrides,
) -> GenerateOutput:
    """Generate images with speculative Jacobi decoding (see the module docstring).

    model: a JanusForConditionalGeneration, a ChameleonForConditionalGeneration (Lumina-mGPT layout), a LlamaGen
    adapter (csd_kernels.models.load_llamagen), an ImageGPT-wrapped causal LM, or any csd_kernels.models.ImageAdapter.
    input_ids [B, S] (left-padded with attention_mask when prompts differ in length), or instead prompt_embeds
    [B, S, C] for adapters that take embedded prompts (they implement ``prefill_embeds``, e.g. LlamaGen t2i caption
    features). config: the settings (None: GenerationConfig()'s defaults; a family's: ``model.defaults``); keywords
    override its fields, e.g. ``generate(model, ids, config=model.defaults, window=32)``. What each setting means:
    :class:`~.config.GenerationConfig` and docs/decoding.md. seed: int s (row b gets s + b) or B per-row seeds.
    cfg_scale = 1 runs no unconditional rows. coupling: the next drafts of sjd / csd, one of COUPLINGS (None:
    DEFAULT_COUPLING). max_lead: rows more than max_lead committed tokens ahead of the slowest row pause (None = one
    window); the tokens do not depend on it, only the pass counts do. static: the fixed-shape iteration on a per-row
    static KV cache, no host sync inside (same tokens and passes at B = 1; every row its own window, so max_lead
    does not apply); None: static with a tree, eager without. cuda_graph (static only; None = on for CUDA): capture
    one iteration in a CUDA graph and replay it. tree (K, D): a draft tree in every window (mode sjd or csd, the
    static loop, the maximal coupling; docs/trees.md): K candidates per position at the first D positions, verified
    by recursive rejection sampling; lossless with sjd, each token with chain csd's law with csd.
    """
    batch = check_prompt(input_ids, prompt_embeds, attention_mask)
    cfg = _config(config, overrides)
    coupling = check_generate(cfg.mode, cfg.coupling)
    tree = check_tree(cfg.tree, cfg.mode, cfg.window, coupling, cfg.static)
    static = tree is not None if cfg.static is None else cfg.static
    coupling = coupling or DEFAULT_COUPLING
    seeds = row_seeds(cfg.seed, batch)
    adapter = get_adapter(model)
    cuda_graph = _check_static(adapter, static, cfg.cuda_graph, cfg.compile, cfg.max_lead)
    if tree is not None and not is_tree_adapter(adapter):
        raise ValueError(f"tree={tree}: {type(adapter).__name__} does not run draft trees (the adapter "
                         "protocol's forward_tree(), keep_path() and supports_tree; docs/trees.md)")
    device = adapter.device
    check_backend(cfg.backend, device)
    check_prompt_ids(input_ids, getattr(adapter, "prompt_vocab_size", None))
    total = adapter.grid[0] * adapter.grid[1]
    mode = cfg.mode
    # ar verifies one sampled token a pass; a tree may run past the grid
    window = cfg.window if tree else min(cfg.window, total) if MODE_TABLE[mode].window else 1
    run = Settings.of(cfg, window=window, total=total, width=adapter.grid[1], vocab=adapter.vocab_size,
                      coupling=coupling, seeds=seeds.to(device), tree=tree, neighbours=_neighbours(adapter, cfg))
    lead = DEFAULT_MAX_LEAD_FACTOR * window if cfg.max_lead is None else cfg.max_lead
    clock = Clock(device, cfg.sync_timings)
    if static:
        if tree is None:
            adapter.static_cache(window)
        else:  # a tree may need more cache slots than a chain (Lumina-mGPT: a forced row end after some nodes)
            adapter.static_cache(window, tree=ref.tree_layout(*tree, window))

    with clock.phase("model"):
        prefill_passes = _prefill(adapter, input_ids, prompt_embeds, attention_mask, cfg.cfg_scale != 1.0)
    bar = _progress_bar(cfg.progress, total, run_label(mode, coupling))
    if static:
        tokens, maps, accepted = _run_static(adapter, run, batch, clock, bar, cuda_graph, cfg.compile)
    else:
        state = EagerState.empty(batch, total, window, run.vocab, run.need_q, device, run.p_columns)
        run_eager(adapter, run, state, lead, clock, bar)
        tokens, maps, accepted = state.seq, state.maps, state.accepted
    if bar is not None:
        bar.close()
    with clock.phase("decode"):
        images = adapter.decode(tokens)
    return _output(tokens, maps, accepted, adapter, images, prefill_passes, clock, batch, mode)


def _neighbours(adapter, cfg: GenerationConfig) -> Optional[torch.Tensor]:
    """The codebook's neighbour table [V, k] the mode's rule needs (lantern, lantern++), else None: k = lantern_k
    (None: default_lantern_k, the published k scaled to the codebook), from the adapter's ``codebook()`` (made once
    per codebook and k)."""
    rule = MODE_TABLE[cfg.mode].rule
    if rule is None or not rule_named(rule).needs_neighbours:
        return None
    k = cfg.lantern_k if cfg.lantern_k is not None else default_lantern_k(rule, adapter.vocab_size)
    codebook = getattr(adapter, "codebook", None)
    table = model_neighbours(codebook() if callable(codebook) else None, k, adapter.vocab_size)
    if table is None:
        raise ValueError(f"mode={cfg.mode!r} needs the model's codebook (its tokens' latent vectors) for the "
                         f"neighbour table; {type(adapter).__name__} has no codebook()")
    return table


def _config(config: Optional[GenerationConfig], overrides: dict) -> GenerationConfig:
    """``config`` (None: the defaults) with ``overrides``; TypeError naming an unknown keyword."""
    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"config: expected a csd_kernels.GenerationConfig or None, got a {type(config).__name__}")
    return (config or GenerationConfig()).replace(**overrides)


def _run_static(adapter, run: Settings, batch: int, clock: "Clock", bar, cuda_graph: bool, compile: bool) -> tuple:
    """The static loop (a tree's when run.tree is set) -> (tokens [B, N], maps [4, B, N], accepted per pass)."""
    state = StaticState.empty(batch, run.total, run.window, run.vocab, run.need_q, adapter.device, run.p_columns)
    iteration = None
    if run.tree is not None:
        iteration = functools.partial(tree_step, layout=device_layout(*run.tree, run.window, adapter.device))
    loop = StaticLoop(adapter, run, state, cuda_graph=cuda_graph, compile=compile, iteration=iteration)
    with clock.phase("loop"):
        loop.run(bar)
    tokens, maps, accepted, _ = loop.output()
    return tokens, maps, accepted


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


def _output(tokens, maps, accepted: list, adapter, images, prefill_passes: int, clock: "Clock",
            batch: int, mode: str) -> GenerateOutput:
    grid = (batch, *adapter.grid)
    return GenerateOutput(
        tokens=tokens, images=images, forward_passes=len(accepted), prefill_passes=prefill_passes, accepted=accepted,
        entropy_map=maps[0].reshape(grid), accept_map=maps[1].reshape(grid), distortion_map=maps[2].reshape(grid),
        tvd_map=maps[3].reshape(grid), timings=clock.summary(), sequences=adapter.image_sequence(tokens), mode=mode,
    )


class Clock:
    """Seconds spent in named phases (model, verify, decode); the rest is the loop's own overhead."""

    def __init__(self, device: torch.device, sync: bool):
        self.sync = sync and device.type == "cuda"
        self.device = device
        self.seconds = {"model": 0.0, "verify": 0.0, "decode": 0.0}  # (+ "loop": the static loop, all phases)
        self.begin = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        yield
        if self.sync:
            torch.cuda.synchronize(self.device)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def summary(self) -> dict:
        total = time.perf_counter() - self.begin
        return dict(self.seconds, rest=total - sum(self.seconds.values()), total=total)


def _progress_bar(progress: bool, total: int, label: str):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"csd_kernels {label}", unit="tok")


# ----------------------------------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------------------------------
def _prefill(adapter, input_ids, prompt_embeds, attention_mask, cfg: bool) -> int:
    if prompt_embeds is None:
        return adapter.prefill(input_ids, attention_mask, cfg)
    if not callable(getattr(adapter, "prefill_embeds", None)):
        raise ValueError(f"{type(adapter).__name__} takes input_ids, not prompt_embeds")
    return adapter.prefill_embeds(prompt_embeds, attention_mask, cfg)
