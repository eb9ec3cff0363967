"""vLLM Model Runner V2's ``rejection_sample`` on :func:`csd_kernels.verify`: the same signature, return and law.

MRV2 (vLLM 0.33, ``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``; the runner vLLM uses wherever
Triton runs) lays a batch out by logits: request r owns rows ``cu_num_logits[r] .. cu_num_logits[r + 1] - 1`` of
``target_logits`` (already processed: divided by the temperature, masked with −inf), the last one its bonus
position; its drafts are ``draft_sampled[cu[r] + 1 .. cu[r + 1] - 1]`` (a draft −1 is rejected). Its state row is
``idx_mapping[r]``: ``temperature`` (0 = greedy), ``seed`` and, when the drafter kept them, ``draft_logits[state, i]``
(pre-temperature: q = softmax(draft_logits / temperature); None: q one-hot at the draft). Greedy rows accept a draft
iff it is the argmax and emit the argmax; random rows run the lossless test and draw the first rejected position
from norm(max(p − q, 0)), the bonus position from p. Return: ``sampled`` [num_reqs, num_speculative_steps + 1] int64
(the accepted drafts, then the recovered or bonus token; −1 after, where vLLM leaves the memory unwritten) and
``num_sampled`` [num_reqs] int32 (accepted + 1).

Here: one :func:`csd_kernels.verify` call per path over [num_reqs, num_speculative_steps + 1] windows (greedy rows at
temperature 0, random rows at temperature 1 on the processed logits), the bonus position an undrafted slot that verify
samples from p. ``rule=`` relaxes the test as in :mod:`.vllm`. The random numbers are verify's Philox stream keyed by
the request's ``seed`` and the ``pos`` of its first logit: the same law as vLLM, not the same tokens; a request repeats
with its seed and position. Watermarking, block verification, synthetic rates and FLy are vLLM's own:
NotImplementedError here, and the plugin (:func:`install`) hands those calls to vLLM's function.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..ops.verify import verify
from .plugin import rebind

__all__ = ["MRV2_MODULES", "rejection_sample", "unsupported", "install"]

_SEED_MASK = (1 << 63) - 1  # vLLM's seeds are any int64; verify's lie in [0, 2^63)
PLACEHOLDER_TOKEN_ID = -1  # written after a request's sampled tokens (vLLM leaves them unwritten)
# where vLLM 0.33 looks the name up: its definition, the MRV2 rejection sampler and the watermarking path
MRV2_MODULES = ("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
                "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
                "vllm.v1.watermarking.spec_decode")
# (name, position, what counts as in use) of the parameters this adapter does not implement
_UNSUPPORTED = (("synthetic_conditional_rates", 11, lambda v: v is not None),
                ("use_block_verification", 13, bool),
                ("contexts", 14, lambda v: v is not None),
                ("watermarking", 15, lambda v: v is not None),
                ("watermark_key", 17, lambda v: v is not None),
                ("fly_window_size", 18, lambda v: bool(v and v > 0)))


def rejection_sample(
    target_logits: torch.Tensor,
    draft_logits: Optional[torch.Tensor],
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    num_speculative_steps: int,
    synthetic_conditional_rates: Optional[torch.Tensor] = None,
    use_fp64: bool = False,
    use_block_verification: bool = False,
    contexts: Optional[torch.Tensor] = None,
    watermarking: Optional[torch.Tensor] = None,
    watermarking_skip_mask: Optional[torch.Tensor] = None,
    watermark_key: Optional[int] = None,
    fly_window_size: int = 0,
    fly_entropy_threshold: float = 0.3,
    fly_entropy_top_k: int = 3,
    *,
    rule: str = "strict",
    validate: bool = True,
    **verify_options,
) -> tuple:
    """MRV2's ``rejection_sample`` (module docstring): (sampled [num_reqs, S + 1] int64, num_sampled [num_reqs] int32).

    ``expanded_idx_mapping`` / ``expanded_local_pos`` are accepted and not needed (the windows come from
    ``cu_num_logits`` and ``idx_mapping``); ``use_fp64`` has no effect (verify draws by inverse CDF).
    Ours, keyword-only: ``rule`` (default "strict", vLLM's law; any rule :func:`csd_kernels.verify` takes),
    ``validate`` (True: one host sync, ValueError on bad input; the plugin passes False) and ``**verify_options``.
    """
    given = dict(synthetic_conditional_rates=synthetic_conditional_rates, use_block_verification=use_block_verification,
                 contexts=contexts, watermarking=watermarking, watermark_key=watermark_key,
                 fly_window_size=fly_window_size)
    if any(in_use(given[name]) for name, _, in_use in _UNSUPPORTED):
        raise NotImplementedError("watermarking, block verification, synthetic and FLy rejection sampling are vLLM's "
                                  "own: csd_kernels runs 'strict' or a csd_kernels rule (rule=); leave them to vLLM")
    del expanded_idx_mapping, expanded_local_pos, use_fp64, watermarking_skip_mask, fly_entropy_threshold
    del fly_entropy_top_k
    _check(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, temperature, seed,
           num_speculative_steps)
    window = _Window(target_logits, draft_logits, cu_num_logits, num_speculative_steps)
    drafts = window.drafts(draft_sampled)
    state = idx_mapping.to(device=window.device, dtype=torch.int64)
    temp = temperature.to(window.device)[state].float()
    is_greedy = temp == 0
    options = dict(rule=rule, return_probs=False, validate=validate, **verify_options)
    options.update(positions=pos.to(window.device, torch.int64)[window.start], offset=0,
                   seed=seed.to(window.device, torch.int64)[state] & _SEED_MASK)
    greedy = verify(window.logits, drafts, None, temperature=0.0, **options)
    q = window.draft_probs(draft_logits, state, torch.where(is_greedy, 1.0, temp))
    random = verify(window.logits, drafts, q, temperature=1.0, **options)
    accept_len = torch.where(is_greedy, greedy.accept_len, random.accept_len).to(torch.int64)
    tokens = torch.where(is_greedy[:, None], greedy.tokens, random.tokens).to(torch.int64)
    column = torch.arange(tokens.shape[1], device=window.device)[None, :]
    sampled = torch.where(column <= accept_len[:, None], tokens, PLACEHOLDER_TOKEN_ID)
    return sampled, (accept_len + 1).to(torch.int32)


def unsupported(args: tuple, kwargs: dict) -> bool:
    """Whether a call, given by position or keyword, uses a feature this adapter leaves to vLLM."""
    for name, position, in_use in _UNSUPPORTED:
        value = args[position] if position < len(args) else kwargs.get(name)
        if in_use(value):
            return True
    return False


class _Window:
    """MRV2's ragged logits as [num_reqs, S + 1] windows: request r's rows, then (never read: undrafted slots after
    its bonus slot) copies of its bonus row. A view, no copy, when every request has S + 1 logits (shape-known: each
    has at most S + 1, so num_logits = num_reqs·(S + 1) means all do)."""

    def __init__(self, target_logits, draft_logits, cu_num_logits, steps: int):
        self.device = target_logits.device
        self.batch, self.width = cu_num_logits.shape[0] - 1, steps + 1
        cu = cu_num_logits.to(device=self.device, dtype=torch.int64)
        self.start, end = cu[:-1], cu[1:]
        self.count = end - self.start - 1  # drafts per request
        column = torch.arange(self.width, device=self.device)
        self.index = torch.minimum(self.start[:, None] + column, (end - 1).clamp(min=0)[:, None])
        vocab = target_logits.shape[1] if draft_logits is None else min(target_logits.shape[1], draft_logits.shape[-1])
        logits = target_logits[:, :vocab]  # vLLM verifies on the shared vocabulary when the target's is padded
        if target_logits.shape[0] == self.batch * self.width:
            self.logits = logits.view(self.batch, self.width, vocab) if vocab == target_logits.shape[1] \
                else logits.reshape(self.batch, self.width, vocab)
        else:
            self.logits = logits[self.index]
        self.drafted = column[None, :] < self.count[:, None]

    def drafts(self, draft_sampled: torch.Tensor) -> torch.Tensor:
        """[num_reqs, S + 1] int64: draft i of request r is draft_sampled[cu[r] + 1 + i]; −1 on undrafted slots."""
        index = (self.index + 1).clamp(max=draft_sampled.shape[0] - 1)
        return torch.where(self.drafted, draft_sampled.to(self.device, torch.int64)[index], PLACEHOLDER_TOKEN_ID)

    def draft_probs(self, draft_logits, state, temp) -> Optional[torch.Tensor]:
        """[num_reqs, S + 1, V] q = softmax(draft_logits[state] / temperature), zeros on the bonus slot; None when
        vLLM kept no draft logits (one-hot drafts)."""
        if draft_logits is None:
            return None
        vocab = self.logits.shape[-1]
        q = torch.softmax(draft_logits[state][:, :self.width - 1, :vocab].float() / temp[:, None, None], dim=-1)
        q = torch.cat([q, q.new_zeros(self.batch, self.width - q.shape[1], vocab)], 1)
        return q


def _check(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, temperature, seed, steps):
    """The shapes MRV2 asserts or assumes, as ValueErrors naming the argument."""
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 2:
        raise ValueError(f"target_logits must be a tensor [num_logits, V], got {_shape(target_logits)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"num_speculative_steps must be an int >= 0, got {steps!r}")
    if draft_logits is not None and (not isinstance(draft_logits, torch.Tensor) or draft_logits.dim() != 3
                                     or draft_logits.shape[1] < steps):
        raise ValueError(f"draft_logits must be None or a tensor [max_num_reqs, num_speculative_steps = {steps}, V], "
                         f"got {_shape(draft_logits)}")
    num_logits = target_logits.shape[0]
    for name, value, size in (("draft_sampled", draft_sampled, num_logits), ("pos", pos, num_logits),
                              ("cu_num_logits", cu_num_logits, None), ("idx_mapping", idx_mapping, None)):
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dim() != 1 \
                or (size is not None and value.shape[0] != size):
            raise ValueError(f"{name} must be a 1-D integer tensor{f' of {size} entries' if size else ''}, got "
                             f"{getattr(value, 'dtype', type(value).__name__)} {_shape(value)}")
    if cu_num_logits.shape[0] != idx_mapping.shape[0] + 1:
        raise ValueError(f"cu_num_logits must have num_reqs + 1 = {idx_mapping.shape[0] + 1} entries, got "
                         f"{cu_num_logits.shape[0]}")
    for name, value in (("temperature", temperature), ("seed", seed)):
        if not isinstance(value, torch.Tensor) or value.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor [max_num_reqs], got {_shape(value)}")


def _shape(value) -> tuple:
    return tuple(getattr(value, "shape", ()))


def install(module, rule: str = "strict") -> bool:
    """Rebinds ``module.rejection_sample`` (one of MRV2_MODULES) to this package's, with ``rule`` and no host sync;
    calls that use watermarking, block verification, synthetic rates or FLy, by keyword or by position, go to vLLM's
    own function. Whether it rebound (False: already done)."""

    def rejection_sample_on_csd_kernels(*args, **kwargs):
        if unsupported(args, kwargs):
            return rejection_sample_on_csd_kernels.csd_kernels_original(*args, **kwargs)
        return rejection_sample(*args, rule=rule, validate=False, **kwargs)

    return rebind(module, "rejection_sample", rejection_sample_on_csd_kernels, ours=rejection_sample)
