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

Batching. Each iteration runs ONE forward call; the KV cache is rolled back (``DynamicCache.crop``) to the common
committed length m = min_b n_b before it. A row is ACTIVE in the iteration when n_b <= m + max_lead, otherwise it is
PAUSED. The forward covers grid positions [m, max over active rows of e_b), so it is at most max_lead + W long. An
active row that is ahead re-feeds its committed tokens in [m, n_b) (passed to verify as committed via ``start``);
positions past its own window get no draft and are ignored. A paused row re-feeds its committed tokens (and junk
past them), is verified as fully committed (start = L), commits nothing and keeps its whole state: tokens, drafts,
the q of its drafts and its attempt counter it_b. Every row's random numbers are keyed by (its own seed, absolute
grid position, it_b = the number of iterations in which the row was active), passed to verify / random_draft_tokens
as per-row offsets. So in each of its active iterations a row sees exactly the window, drafts, q and random numbers
it would see alone: a row's tokens do not depend on the other rows of the batch nor on max_lead (up to the float
noise of batched matmuls); only forward_passes and the forward lengths do. The only host sync per iteration is
reading accept_len.

max_lead trades forward length against forward passes: a large lead keeps every row busy (fewest passes) but the
forward spans the whole spread of the batch (mean 57 tokens at B=16, 62 at B=64 on the digits model, sjd, W=16,
versus 16 at B=1); a small lead bounds the forward to max_lead + W tokens at the cost of some passes in which rows
sit out. See DEFAULT_MAX_LEAD_FACTOR for the measurement behind the default (max_lead = W).

Memory: q for a position drafted in a row's previous active iteration is that iteration's p. With
``temperature > 0`` the loop keeps a per-row q store [B, W, V] float32 (slot j = grid position n_b + j, written from
p when the row is active, left untouched while it is paused) and materialises one [B, L, V] q per iteration (a
gather from the store). When no row has such a draft, q is a stride-0 expanded 1/V; at temperature 0 q is not needed
(p is one-hot, and one-hot or 1/V drafts give identical decisions) and verify gets ``draft_probs=None``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np
import torch

from . import reference as R
from .grouped import DEFAULT_GROUP_DELTA, DEFAULT_GROUP_RANK, grouped_verify
from .models import get_adapter
from .ops import verify

__all__ = ["MODES", "COUPLINGS", "DEFAULT_COUPLING", "GenerateOutput", "generate"]

MODES = ("ar", "jd", "sjd", "gsd", "csd")
COUPLINGS = {"none": "independent", "independent": "independent", "maximal": "maximal", "gumbel": "gumbel"}
# The coupling used when coupling=None: all three pass the chi-square lossless test (tests/test_decoding.py) and
# "maximal" took the fewest forward passes on the tiny models (sjd, window 16, 8x8 grid, 200 rows, mean passes per
# row: 16 codes 51.3 none / 48.4 maximal / 49.2 gumbel; 8 codes 16.8 / 12.2 / 13.0; AR = 64).
DEFAULT_COUPLING = "maximal"
DRAFT_INITS = ("uniform", "above")
# max_lead=None means max_lead = DEFAULT_MAX_LEAD_FACTOR * window (see the module docstring, "Batching"), so a
# forward call spans at most 2·W positions. Measured on the digits model (sjd, W = 16, seed 0, prompts "7"), forward
# passes / mean forward length / row-tokens through the model (passes × length) at B = 64:
#   unbounded (the old loop): 108 / 61.6 / 6650;  max_lead = 16 (= W): 128 / 28.9 / 3700;
#   8: 150 / 22.5 / 3380;  0: 256 / 15.5 / 3970  (B = 16: unbounded 108 / 56.7, W: 119 / 27.8, 0: 255 / 15.5).
# max_lead = W nearly halves the forward compute for +18% passes; smaller leads save little more compute and cost
# many more passes (0 degenerates to AR's pass count), so the default is one window.
DEFAULT_MAX_LEAD_FACTOR = 1


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

    def passes_per_row(self) -> np.ndarray:
        """[B] forward passes each row needed: the passes in which it still committed tokens (every row has its own
        window, so this is the count the row would need if generated alone)."""
        return (np.asarray(self.accepted) > 0).sum(0)


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


def _check_prompt(input_ids, prompt_embeds) -> int:
    """Exactly one of input_ids [B, S] (integer) / prompt_embeds [B, S, C] (floating); returns B."""
    if (input_ids is None) == (prompt_embeds is None):
        raise ValueError("pass exactly one of input_ids and prompt_embeds")
    if prompt_embeds is not None:
        prompt = prompt_embeds
        if not isinstance(prompt, torch.Tensor) or prompt.ndim != 3 or not prompt.is_floating_point():
            raise ValueError("prompt_embeds must be a [B, S, C] floating-point tensor")
    else:
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
            raise ValueError("input_ids must be a [B, S] integer tensor")
        if input_ids.is_floating_point():
            raise ValueError("input_ids must hold integer token ids")
        prompt = input_ids
    if prompt.shape[0] < 1 or prompt.shape[1] < 1:
        raise ValueError(f"the prompt must be non-empty [B >= 1, S >= 1, ...], got shape {tuple(prompt.shape)}")
    return int(prompt.shape[0])


def _prefill(adapter, input_ids, prompt_embeds, attention_mask, cfg: bool) -> int:
    if prompt_embeds is None:
        return adapter.prefill(input_ids, attention_mask, cfg)
    if not callable(getattr(adapter, "prefill_embeds", None)):
        raise ValueError(f"{type(adapter).__name__} takes input_ids, not prompt_embeds")
    return adapter.prefill_embeds(prompt_embeds, attention_mask, cfg)


def _check_args(mode, window, temperature, top_k, draft_init, coupling, max_lead=None):
    if max_lead is not None and (isinstance(max_lead, bool) or not isinstance(max_lead, int) or max_lead < 0):
        raise ValueError(f"max_lead must be None or an int >= 0, got {max_lead!r}")
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


# ------------------------------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------------------------------
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
) -> GenerateOutput:
    """Generate images with speculative Jacobi decoding (see the module docstring).

    model: a JanusForConditionalGeneration, a ChameleonForConditionalGeneration (Lumina-mGPT layout), an
    ImageGPT-wrapped causal LM, a LlamaGen adapter (csd_kernels.models.load_llamagen), or any
    csd_kernels.models.ImageAdapter. input_ids [B, S] (left-padded with attention_mask when prompts differ in
    length), or instead prompt_embeds [B, S, C] for adapters that take embedded prompts (they implement
    ``prefill_embeds``, e.g. LlamaGen t2i caption features; ValueError for the others). seed: int s (row b gets
    s + b) or B per-row seeds.
    cfg_scale = 1 runs no unconditional rows. group_rank / group_delta: the GSD group (k, δ).
    sync_timings: on CUDA, synchronise around the timed phases (otherwise host-side times: asynchronous model work
    is then attributed to verify, where the loop waits for accept_len).
    max_lead: a row is verified in an iteration only while it is at most max_lead committed tokens ahead of the
    slowest row (others pause without changing their tokens), which bounds each forward call to max_lead + window
    positions. 0 = only the rows with the fewest committed tokens advance; None = DEFAULT_MAX_LEAD_FACTOR·window.
    The tokens do not depend on max_lead, only forward_passes and the forward lengths do.
    """
    batch = _check_prompt(input_ids, prompt_embeds)
    _check_args(mode, window, temperature, top_k, draft_init, coupling, max_lead)
    adapter = get_adapter(model)
    height, width = adapter.grid
    total = height * width
    vocab = adapter.vocab_size
    if mode == "ar":
        window = 1
    window = min(window, total)
    lead = DEFAULT_MAX_LEAD_FACTOR * window if max_lead is None else max_lead
    device = adapter.device
    seeds = _row_seeds(seed, batch).to(device)  # [B]
    next_drafts = COUPLINGS[coupling or ("none" if mode in ("ar", "jd", "gsd") else DEFAULT_COUPLING)]
    need_q = temperature > 0 and mode in ("sjd", "csd", "gsd")
    sync = (lambda: torch.cuda.synchronize(device)) if (sync_timings and device.type == "cuda") else (lambda: None)

    t_start = time.perf_counter()
    t_model = t_verify = 0.0
    prefill_passes = _prefill(adapter, input_ids, prompt_embeds, attention_mask, cfg_scale != 1.0)
    sync()
    t_model += time.perf_counter() - t_start

    seq = torch.zeros(batch, total, dtype=torch.int64, device=device)  # committed tokens, then sampled drafts
    maps = torch.zeros(4, batch, total, dtype=torch.float32, device=device)  # entropy, accept, distortion, tvd
    n = [0] * batch  # committed tokens per row (host mirror of n_dev, refreshed by the one sync per iteration)
    n_dev = torch.zeros(batch, 1, dtype=torch.int64, device=device)  # [B, 1]
    drafted_dev = torch.zeros(batch, 1, dtype=torch.int64, device=device)  # seq[b, n_b:drafted_b] = sampled drafts
    row_sampled = [False] * batch  # row b holds drafts sampled in its last active iteration (host-known)
    attempts = torch.zeros(batch, dtype=torch.int64, device=device)  # it_b: active iterations of row b (its offset)
    # q_store[b, j] = p of row b's last active iteration at grid position n_b + j (the q of its sampled drafts)
    q_store = torch.zeros(batch, window, vocab, dtype=torch.float32, device=device) if need_q else None
    slots = torch.arange(window, device=device)[None, :]  # [1, W]
    accepted: list = []
    iteration = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"csd_kernels {mode}", unit="tok")

    while min(n) < total:
        m = min(n)
        active = [nb <= m + lead for nb in n]  # host-known; the slowest row is always active
        all_active = all(active)
        end = min(max(nb for nb, a in zip(n, active) if a) + window, total)
        length = end - m  # L <= max_lead + W
        active_dev = n_dev <= m + lead  # [B, 1], the same mask on the device (no sync)
        grid_pos = torch.arange(m, end, device=device)[None, :]  # [1, L] absolute grid index of window slot i
        win_end = (n_dev + window).clamp(max=total)  # [B, 1] e_b: row b's window is [n_b, e_b)
        committed = (grid_pos < n_dev) | ~active_dev  # [B, L]; a paused row is verified as fully committed
        draftable = (grid_pos >= n_dev) & (grid_pos < win_end - 1) & active_dev  # [B, L] slots that get a draft
        sampled = draftable & (grid_pos < drafted_dev)
        fresh = draftable & ~sampled

        # ---- drafts for grid positions [m, end) --------------------------------------------------------------
        positions = torch.full((batch,), m, dtype=torch.int64, device=device)  # [B]
        fresh_tokens = R.random_draft_tokens(seeds, attempts, positions, length, vocab)  # [B, L]
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
        start = torch.where(active_dev[:, 0], (n_dev[:, 0] - m).clamp(0, length), length)  # [B] committed prefix
        q = None
        if need_q:
            fill = torch.full((1, 1, 1), 1.0 / vocab, device=device).expand(batch, length, vocab)  # stride 0
            if draft_init == "above":
                fill = torch.where(above[..., None], torch.nn.functional.one_hot(fresh_tokens, vocab).float(), fill)
            if any(s and a for s, a in zip(row_sampled, active)):  # q of a sampled draft: materialise [B, L, V]
                index = (grid_pos - n_dev).clamp(0, window - 1)  # [B, L] slot of the row's q store
                stored = q_store.gather(1, index[..., None].expand(batch, length, vocab))
                q = torch.where(sampled[..., None], stored, fill)
            else:
                q = fill
        common = dict(uncond_logits=uncond, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k)
        if mode == "gsd":
            res = grouped_verify(cond, drafts, q, **common, group_rank=group_rank, group_delta=group_delta,
                                 start=start, positions=positions, seed=seeds, offset=attempts, return_probs=need_q)
            accept_len = res.accept_len
        elif mode == "jd":
            # fresh samples at every uncommitted position; accept drafts while they equal the fresh sample
            res = verify(cond, torch.where(committed, drafts, -1), None, **common, mode="strict", start=start,
                         next_drafts="independent", positions=positions, seed=seeds, offset=attempts,
                         return_probs=False, backend=backend, validate=False)
            match = committed | (drafts == res.tokens)  # [B, L]
            accept_len = torch.where(match.all(-1), length, (~match).to(torch.int64).argmax(-1))
        else:  # ar, sjd, csd
            res = verify(cond, drafts, q, **common, mode="csd" if mode == "csd" else "strict",
                         entropy_coef=entropy_coef, tvd_threshold=tvd_threshold, start=start, next_drafts=next_drafts,
                         positions=positions, seed=seeds, offset=attempts, return_probs=need_q, backend=backend,
                         validate=False)
            accept_len = res.accept_len
        # the one host sync of the iteration: accept_len and the verify status bits together
        accept_list, status = torch.stack([accept_len.to(torch.int64), res.status.to(torch.int64)]).tolist()
        if any(s and a for s, a in zip(status, active)):
            raise ValueError(f"verification flagged the model's logits or the drafts (status bits {status}; "
                             f"1 = NaN/Inf logits) at grid positions {m}..{end - 1}")
        t2 = time.perf_counter()
        t_verify += t2 - t1

        # ---- commit (active rows only; a paused row keeps seq, drafts, q store and it_b as they are) ------------
        new_n = [min(m + a + 1, max(min(nb + window, total), nb)) if act else nb
                 for a, nb, act in zip(accept_list, n, active)]
        new_dev = torch.minimum(m + accept_len.to(torch.int64)[:, None] + 1, torch.maximum(win_end, n_dev))  # [B, 1]
        new_dev = torch.where(active_dev, new_dev, n_dev)
        # committed prefix, resampled token, next drafts (junk past a row's window)
        seq[:, m:end] = res.tokens if all_active else torch.where(active_dev, res.tokens, seq[:, m:end])
        newly = (grid_pos >= n_dev) & (grid_pos < new_dev)  # [B, L]
        if mode == "jd":  # accept indicator; the distortion of sampled-draft matching is not tracked
            accept_prob, distortion = match.float(), torch.full_like(res.entropy, float("nan"))
        else:
            accept_prob, distortion = res.accept_prob, res.distortion
        stats = torch.stack([res.entropy, accept_prob, distortion, res.tvd]).float()  # [4, B, L]
        maps[:, :, m:end] = torch.where(newly[None], stats, maps[:, :, m:end])
        accepted.append([b - a for a, b in zip(n, new_n)])
        row_sampled = [min(nb + window, total) > nn if act else s
                       for nb, nn, act, s in zip(n, new_n, active, row_sampled)]
        if need_q and any(row_sampled):  # keep p at the row's new window [new n_b, new n_b + W) for its next drafts
            index = (new_dev - m + slots).clamp(0, length - 1)  # [B, W] slot -> window index of this iteration
            fresh_q = res.probs.gather(1, index[..., None].expand(batch, window, vocab))
            q_store = fresh_q if all_active else torch.where(active_dev[..., None], fresh_q, q_store)
        drafted_dev = torch.where(active_dev, win_end, drafted_dev)
        attempts = attempts + active_dev[:, 0].to(torch.int64)
        if bar is not None:
            bar.update(min(new_n) - m)
        n, n_dev = new_n, new_dev
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
