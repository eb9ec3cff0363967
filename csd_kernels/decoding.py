"""Speculative Jacobi decoding of AR image generators: ``generate(model, input_ids, mode=...)``.

Modes (one target-model forward call per loop iteration in every mode):

* ``ar``  one token per forward pass (the baseline).
* ``jd``  Jacobi decoding: a draft is accepted iff it equals the token freshly sampled at its position (lossless at
          temperature 0 only).
* ``sjd`` speculative Jacobi decoding, ``verify(mode="strict")``: lossless.
* ``gsd`` grouped speculative decoding (:mod:`csd_kernels.grouped`).
* ``csd`` content-aware speculative decoding, ``verify(mode="csd")``.

Jacobi bookkeeping (grid indices only, see :mod:`csd_kernels.models.protocol`). Row b has committed n_b tokens.
Its window is the W grid positions [n_b, e_b), e_b = min(n_b + W, H*W): the model input is the last committed token
plus the W−1 drafts at n_b .. e_b−2 and the logits at slot j predict n_b + j. The draft at a position is the token
sampled there in the previous iteration (q = that iteration's p), or a fresh one where no previous window reached:
uniformly random (q = 1/V, from :func:`csd_kernels.reference.random_draft_tokens`) or, with ``draft_init="above"``,
the committed token of the grid row above (q one-hot). The last window slot has no draft (-1). The row commits the
accepted prefix plus the token resampled at the first rejection.

Batching. Each iteration runs ONE forward call over grid positions [m, max_b e_b), m = min_b n_b; the KV cache is
rolled back (``DynamicCache.crop``) to the common committed length m before it. A row that is ahead re-feeds its
committed tokens in [m, n_b) (passed to verify as committed via ``start``); positions past its own window get no
draft and are ignored. So every row sees exactly the window, drafts and q it would see alone, and its random numbers
depend only on (its seed, absolute grid position, iteration number): a row's tokens do not depend on the other rows
of the batch (up to the float noise of batched matmuls). The only host sync per iteration is reading accept_len.

Memory: q for positions drafted in the previous iteration is that iteration's p, so with ``temperature > 0`` the
loop materialises one [B, L, V] float32 q per iteration (a gather from the previous p, the size of the logits). When
no position has a previous-iteration draft, q is a stride-0 expanded 1/V; at temperature 0 q is not needed (p is
one-hot, and one-hot or 1/V drafts give identical decisions) and verify gets ``draft_probs=None``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch

from . import reference as R
from .grouped import DEFAULT_GROUP_DELTA, DEFAULT_GROUP_RANK, grouped_verify
from .models import get_adapter

__all__ = ["MODES", "COUPLINGS", "DEFAULT_COUPLING", "GenerateOutput", "generate"]

MODES = ("ar", "jd", "sjd", "gsd", "csd")
COUPLINGS = {"none": "independent", "independent": "independent", "maximal": "maximal", "gumbel": "gumbel"}
# The coupling used when coupling=None: all three pass the chi-square lossless test (tests/test_decoding.py) and
# "maximal" took the fewest forward passes on the tiny models (sjd, window 16, 8x8 grid, 200 rows, mean passes per
# row: 16 codes 51.3 none / 48.4 maximal / 49.2 gumbel; 8 codes 16.8 / 12.2 / 13.0; AR = 64).
DEFAULT_COUPLING = "maximal"
DRAFT_INITS = ("uniform", "above")


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
    timings: dict = field(default_factory=dict)  # seconds: model, verify, rest, total
    sequences: Optional[torch.Tensor] = None  # [B, T] the image part in the model's own vocabulary and layout


# ------------------------------------------------------------------------------------------------------------------
# argument handling
# ------------------------------------------------------------------------------------------------------------------
def _row_seeds(seed, batch: int) -> torch.Tensor:
    """int s -> [s, s+1, ..., s+B-1]; a sequence / tensor of B ints -> as given.  Returns [B] int64 (CPU)."""
    if isinstance(seed, torch.Tensor) and seed.numel() == 1 and seed.ndim == 0:
        seed = int(seed)
    if isinstance(seed, int):
        return torch.arange(batch, dtype=torch.int64) + seed
    seeds = torch.as_tensor(list(seed) if not isinstance(seed, torch.Tensor) else seed, dtype=torch.int64).reshape(-1)
    if seeds.numel() != batch:
        raise ValueError(f"seed: expected an int or {batch} per-row seeds, got {seeds.numel()}")
    return seeds


def _check_args(input_ids, mode, window, temperature, top_k, draft_init, coupling):
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        raise ValueError("input_ids must be a [B, S] integer tensor")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be a non-empty prompt [B >= 1, S >= 1], got shape {tuple(input_ids.shape)}")
    if input_ids.is_floating_point():
        raise ValueError("input_ids must hold integer token ids")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if draft_init not in DRAFT_INITS:
        raise ValueError(f"unknown draft_init {draft_init!r}; expected one of {DRAFT_INITS}")
    if coupling is not None and coupling not in COUPLINGS:
        raise ValueError(f"unknown coupling {coupling!r}; expected None or one of {tuple(COUPLINGS)}")
    if mode in ("ar", "jd", "gsd") and coupling not in (None, "none", "independent"):
        raise ValueError(f"coupling={coupling!r} applies to sjd and csd only (mode={mode!r} draws next drafts independently)")


def _verify_fn():
    """csd_kernels.verify when the package provides it, else the reference with the same semantics."""
    import csd_kernels

    fn = getattr(csd_kernels, "verify", None)
    if fn is not None:
        return fn

    def reference_verify(target_logits, draft_tokens, draft_probs=None, *, start, positions, seed, offset,
                         backend=None, validate=True, **kwargs):
        return R.verify(target_logits, draft_tokens, draft_probs, start=start, positions=positions,
                        seed=torch.as_tensor(seed, dtype=torch.int64).reshape(-1),
                        offset=torch.as_tensor(offset, dtype=torch.int64).reshape(-1), **kwargs)

    return reference_verify


# ------------------------------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    *,
    attention_mask: Optional[torch.Tensor] = None,
    mode: str = "csd",
    window: int = 16,
    cfg_scale: float = 5.0,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
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
) -> GenerateOutput:
    """Generate images with speculative Jacobi decoding (see the module docstring).

    model: a JanusForConditionalGeneration, a ChameleonForConditionalGeneration (Lumina-mGPT layout), an
    ImageGPT-wrapped causal LM, or any csd_kernels.models.ImageAdapter. input_ids [B, S] (left-padded with
    attention_mask when prompts differ in length). seed: int s (row b gets s + b) or B per-row seeds.
    cfg_scale = 1 runs no unconditional rows. group_rank / group_delta: the GSD group (k, δ).
    sync_timings: on CUDA, synchronise around the timed phases (otherwise host-side times: asynchronous model work
    is then attributed to verify, where the loop waits for accept_len).
    """
    _check_args(input_ids, mode, window, temperature, top_k, draft_init, coupling)
    adapter = get_adapter(model)
    batch = int(input_ids.shape[0])
    height, width = adapter.grid
    total = height * width
    vocab = adapter.vocab_size
    if mode == "ar":
        window = 1
    window = min(window, total)
    device = adapter.device
    seeds = _row_seeds(seed, batch).to(device)  # [B]
    verify = _verify_fn()
    next_drafts = COUPLINGS[coupling or ("none" if mode in ("ar", "jd", "gsd") else DEFAULT_COUPLING)]
    need_q = temperature > 0 and mode in ("sjd", "csd", "gsd")
    sync = (lambda: torch.cuda.synchronize(device)) if (sync_timings and device.type == "cuda") else (lambda: None)

    t_start = time.perf_counter()
    t_model = t_verify = 0.0
    prefill_passes = adapter.prefill(input_ids, attention_mask, cfg_scale != 1.0)
    sync()
    t_model += time.perf_counter() - t_start

    seq = torch.zeros(batch, total, dtype=torch.int64, device=device)  # committed tokens, then sampled drafts
    maps = torch.zeros(4, batch, total, dtype=torch.float32, device=device)  # entropy, accept, distortion, tvd
    n = [0] * batch  # committed tokens per row (host mirror of n_dev, refreshed by the one sync per iteration)
    n_dev = torch.zeros(batch, 1, dtype=torch.int64, device=device)  # [B, 1]
    drafted_dev = torch.zeros(batch, 1, dtype=torch.int64, device=device)  # seq[b, n_b:drafted_b] = sampled drafts
    has_sampled = False  # some row holds drafts sampled in the previous iteration (host-known)
    offsets = torch.arange(total + 1, dtype=torch.int64, device=device)  # offsets[i:i+1] = iteration i, no copy
    prev_probs, prev_m = None, 0  # p of the previous iteration [B, L_prev, V] and its first grid position
    accepted: list = []
    iteration = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"csd_kernels {mode}", unit="tok")

    while min(n) < total:
        m, top = min(n), max(n)
        end = min(top + window, total)
        length = end - m  # L
        offset = offsets[iteration : iteration + 1]  # [1]
        grid_pos = torch.arange(m, end, device=device)[None, :]  # [1, L] absolute grid index of window slot i
        win_end = (n_dev + window).clamp(max=total)  # [B, 1] e_b: row b's window is [n_b, e_b)
        committed = grid_pos < n_dev  # [B, L]
        draftable = (grid_pos >= n_dev) & (grid_pos < win_end - 1)  # [B, L] slots that get a draft
        sampled = draftable & (grid_pos < drafted_dev)
        fresh = draftable & ~sampled

        # ---- drafts for grid positions [m, end) --------------------------------------------------------------
        positions = torch.full((batch,), m, dtype=torch.int64, device=device)  # [B]
        fresh_tokens = R.random_draft_tokens(seeds, offset, positions, length, vocab)  # [B, L]
        if draft_init == "above":
            above_pos = grid_pos[0] - width  # [L]
            above = fresh & (above_pos >= 0) & (above_pos < n_dev)  # [B, L]
            fresh_tokens = torch.where(above, seq[:, above_pos.clamp(min=0)], fresh_tokens)
        drafts = torch.where(committed | sampled, seq[:, m:end], torch.where(fresh, fresh_tokens, -1))  # [B, L]

        # ---- one forward call: inputs x_{m-1} .. x_{end-2} ----------------------------------------------------
        t0 = time.perf_counter()
        adapter.crop(m - 1)
        last = seq[:, m - 1 : m] if m > 0 else torch.zeros(batch, 1, dtype=torch.int64, device=device)
        inputs = torch.cat([last, drafts[:, :-1].clamp(min=0)], 1)  # [B, L]
        cond, uncond = adapter.forward(inputs, m - 1)  # [B, L, V] each
        if cond.dtype == torch.float64:  # verify takes float32 / bf16 / fp16 logits
            cond, uncond = cond.float(), (None if uncond is None else uncond.float())
        sync()
        t1 = time.perf_counter()
        t_model += t1 - t0

        # ---- verification ----------------------------------------------------------------------------------------
        start = (n_dev[:, 0] - m).clamp(0, length)  # [B] committed prefix of each row's window
        q = None
        if need_q:
            fill = torch.full((1, 1, 1), 1.0 / vocab, device=device).expand(batch, length, vocab)  # stride 0
            if draft_init == "above":
                fill = torch.where(above[..., None], torch.nn.functional.one_hot(fresh_tokens, vocab).float(), fill)
            if has_sampled:  # q of a previous-iteration draft is that iteration's p: materialise [B, L, V]
                index = (grid_pos[0] - prev_m).clamp(0, prev_probs.shape[1] - 1)  # [L]
                q = torch.where(sampled[..., None], prev_probs[:, index], fill)
            else:
                q = fill
        common = dict(uncond_logits=uncond, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k)
        if mode == "gsd":
            res = grouped_verify(cond, drafts, q, **common, group_rank=group_rank, group_delta=group_delta,
                                 start=start, positions=positions, seed=seeds, offset=offset, return_probs=need_q)
            accept_len = res.accept_len
        elif mode == "jd":
            # fresh samples at every uncommitted position; accept drafts while they equal the fresh sample
            res = verify(cond, torch.where(committed, drafts, -1), None, **common, mode="strict", start=start,
                         next_drafts="independent", positions=positions, seed=seeds, offset=offset,
                         return_probs=False, backend=backend, validate=False)
            match = committed | (drafts == res.tokens)  # [B, L]
            accept_len = torch.where(match.all(-1), length, (~match).to(torch.int64).argmax(-1))
        else:  # ar, sjd, csd
            res = verify(cond, drafts, q, **common, mode="csd" if mode == "csd" else "strict",
                         entropy_coef=entropy_coef, tvd_threshold=tvd_threshold, start=start, next_drafts=next_drafts,
                         positions=positions, seed=seeds, offset=offset, return_probs=need_q, backend=backend,
                         validate=False)
            accept_len = res.accept_len
        # the one host sync of the iteration: accept_len and the verify status bits together
        accept_list, status = torch.stack([accept_len.to(torch.int64), res.status.to(torch.int64)]).tolist()
        if any(status):
            raise ValueError(f"verification flagged the model's logits or the drafts (status bits {status}; "
                             f"1 = NaN/Inf logits) at grid positions {m}..{end - 1}")
        t2 = time.perf_counter()
        t_verify += t2 - t1

        # ---- commit ------------------------------------------------------------------------------------------------
        new_n = [min(m + a + 1, max(min(nb + window, total), nb)) for a, nb in zip(accept_list, n)]
        new_dev = torch.minimum(m + accept_len.to(torch.int64)[:, None] + 1, torch.maximum(win_end, n_dev))  # [B, 1]
        seq[:, m:end] = res.tokens  # committed prefix, resampled token, next drafts (junk past a row's window)
        newly = (grid_pos >= n_dev) & (grid_pos < new_dev)  # [B, L]
        if mode == "jd":  # accept indicator; the distortion of sampled-draft matching is not tracked
            accept_prob, distortion = match.float(), torch.full_like(res.entropy, float("nan"))
        else:
            accept_prob, distortion = res.accept_prob, res.distortion
        stats = torch.stack([res.entropy, accept_prob, distortion, res.tvd]).float()  # [4, B, L]
        maps[:, :, m:end] = torch.where(newly[None], stats, maps[:, :, m:end])
        accepted.append([b - a for a, b in zip(n, new_n)])
        has_sampled = any(min(nb + window, total) > nn for nb, nn in zip(n, new_n))
        drafted_dev = win_end
        if bar is not None:
            bar.update(min(new_n) - m)
        n, n_dev = new_n, new_dev
        prev_probs, prev_m = res.probs, m
        iteration += 1

    if bar is not None:
        bar.close()
    t3 = time.perf_counter()
    images = adapter.decode(seq)
    sync()
    t_end = time.perf_counter()
    grid = (batch, height, width)
    return GenerateOutput(
        tokens=seq,
        images=images,
        forward_passes=iteration,
        prefill_passes=prefill_passes,
        accepted=accepted,
        entropy_map=maps[0].reshape(grid),
        accept_map=maps[1].reshape(grid),
        distortion_map=maps[2].reshape(grid),
        tvd_map=maps[3].reshape(grid),
        timings={"model": t_model, "verify": t_verify, "decode": t_end - t3,
                 "rest": (t_end - t_start) - t_model - t_verify - (t_end - t3), "total": t_end - t_start},
        sequences=adapter.image_sequence(seq),
    )
