"""vLLM V1's ``rejection_sample`` on :func:`csd_kernels.verify`: the same signature, return and law.

vLLM (0.33, ``vllm/v1/sample/rejection_sampler.py``) flattens the drafts of a batch (``cu_num_draft_tokens``), hands
``rejection_sample`` target logits already divided by each request's temperature and filtered by its top-k / top-p
(−inf), and marks greedy requests by temperature 0. Per request: greedy rows accept a draft iff it is the argmax;
random rows run the lossless test (accept x with probability min(1, p(x)/q(x)), q one-hot at the draft when
``draft_probs`` is None, a draft −1 or with q(x) = 0 rejected), the first rejection emits a token from
norm(max(p − q, 0)); a request that accepted all its drafts gets its ``bonus_token_ids`` entry. The output is
[B, max_spec_len + 1] int32, −1 after each request's tokens.

Here both paths are one :func:`csd_kernels.verify` call each over the requests' padded windows (greedy rows at
temperature 0, where p is one-hot at the argmax), so ``rule=`` relaxes the test with any rule verify takes. What
differs from vLLM: the random numbers (verify's counter-based Philox stream, seeded per request from its
``torch.Generator`` when it has one): the same law, not the same tokens.

``register()`` is the ``vllm.general_plugins`` entry point (setup.py): with ``CSD_KERNELS_VLLM`` set to a rule (or 1
for "strict") it rebinds ``vllm.v1.sample.rejection_sampler.rejection_sample`` to this function and Model Runner V2's
``rejection_sample`` (the runner vLLM 0.33 uses wherever Triton runs) to :mod:`.vllm_mrv2`'s; the modes this package
does not implement still go to vLLM's own functions.
"""

from __future__ import annotations

import importlib
from typing import Optional, Sequence

import torch

from ..ops.verify import verify
from . import vllm_mrv2
from .plugin import rebind, rule_from_env, rule_from_value

__all__ = ["PLACEHOLDER_TOKEN_ID", "PLUGIN_ENV", "V1_MODULE", "rejection_sample", "register", "install_everywhere",
           "swap_in_worker", "install", "unsupported"]

PLACEHOLDER_TOKEN_ID = -1  # vLLM's padding after a request's tokens
GREEDY_TEMPERATURE = 0  # vLLM 0.33 marks greedy requests by temperature 0
PLUGIN_ENV = "CSD_KERNELS_VLLM"
V1_MODULE = "vllm.v1.sample.rejection_sampler"  # where V1's RejectionSampler.forward looks the name up
_SEED_HIGH = (1 << 63) - 1


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata,
    synthetic_mode: bool = False,
    synthetic_conditional_rates: Optional[torch.Tensor] = None,
    use_fp64_gumbel: bool = False,
    fly_window_size: Optional[int] = None,
    fly_entropy_threshold: Optional[float] = None,
    fly_entropy_top_k: int = 3,
    *,
    rule: str = "strict",
    validate: bool = True,
    **verify_options,
) -> torch.Tensor:
    """vLLM V1's ``rejection_sample`` (module docstring): output_token_ids [B, max_spec_len + 1] int32.

    ``sampling_metadata`` is read duck-typed: ``all_greedy``, ``all_random``, ``temperature`` ([B], 0 = greedy; None
    when all_greedy) and ``generators`` ({request index: torch.Generator}, may be empty; a request with one draws its
    Philox seed from it, only when it has drafts and the batch is not all greedy, so its tokens repeat with the
    generator's seed). ``use_fp64_gumbel`` is accepted and has no effect (verify draws the recovered token by inverse
    CDF on its own uniforms). ``synthetic_mode`` and FLy (``fly_window_size``) are vLLM's own rules: NotImplementedError
    here (the plugin leaves them to vLLM).

    Ours, keyword-only: ``rule`` (default "strict", vLLM's law; any rule :func:`csd_kernels.verify` takes),
    ``validate`` (True: one host sync, ValueError on NaN / out-of-range input; the plugin passes False: no sync) and
    ``**verify_options`` for verify (the rule's parameters, ``backend``).

    Shape: draft_token_ids [T] int, cu_num_draft_tokens [B] int (inclusive cumulative sums of num_draft_tokens, a
    list of B ints summing to T), draft_probs [T, V] float32 or None, target_logits [T, V] float32/bfloat16/float16,
    bonus_token_ids [B, 1] (or [B]) int.
    """
    if synthetic_mode or fly_window_size is not None:
        raise NotImplementedError("synthetic and FLy rejection sampling are vLLM's own rules: csd_kernels runs "
                                  "'strict' or a csd_kernels rule (rule=); leave those modes to vLLM's sampler")
    del synthetic_conditional_rates, use_fp64_gumbel, fly_entropy_threshold, fly_entropy_top_k
    counts = _check(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
                    bonus_token_ids)
    batch, width = len(counts), max(counts, default=0)
    device = target_logits.device
    bonus = bonus_token_ids.reshape(batch).to(device=device, dtype=torch.int64)
    output = torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device)
    if width == 0:  # no request has drafts: each gets its bonus token
        output[:, 0] = bonus
        return output
    window = _Window(cu_num_draft_tokens, counts, draft_token_ids.shape[0], device)
    drafts = torch.where(window.drafted, window.gather(draft_token_ids), PLACEHOLDER_TOKEN_ID)
    logits = window.gather(target_logits)
    options = dict(rule=rule, return_probs=False, validate=validate, **verify_options)
    accept_len, tokens = _decide(sampling_metadata, counts, logits, drafts, window.gather(draft_probs), options)
    output[:, :width + 1] = _emitted(tokens, accept_len, window.count, bonus)
    return output


class _Window:
    """vLLM's flattened ragged rows as [B, width] windows: request b's k_b rows, then (never read as drafts) copies
    of a valid row. One view, no copy, when every request has the same number of drafts."""

    def __init__(self, cu_num_draft_tokens: torch.Tensor, counts: list, total: int, device):
        self.batch, self.width = len(counts), max(counts)
        cu = cu_num_draft_tokens.to(device=device, dtype=torch.int64)
        self.count = torch.diff(cu, prepend=cu.new_zeros(1))  # [B] drafts per request, on the device
        column = torch.arange(self.width, device=device)
        self.drafted = column[None, :] < self.count[:, None]
        self.uniform = all(k == self.width for k in counts)
        self.index = None if self.uniform else ((cu - self.count)[:, None] + column).clamp(max=total - 1)

    def gather(self, flat: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if flat is None:
            return None
        if self.uniform:
            return flat.view(self.batch, self.width, *flat.shape[1:])
        return flat[self.index]


def _decide(sampling_metadata, counts: list, logits, drafts, draft_probs, options: dict):
    """(accept_len [B], tokens [B, width]): greedy rows by verify at temperature 0 (p one-hot at the argmax; the
    draft probabilities play no part, as in vLLM's greedy path), random rows by verify at temperature 1 (the logits
    are already divided by the temperature) with one Philox seed per request."""
    all_greedy, all_random = bool(sampling_metadata.all_greedy), bool(sampling_metadata.all_random)
    greedy = random = None
    if not all_random:
        greedy = verify(logits, drafts, None, temperature=0.0, seed=0, **options)
    if not all_greedy:
        seeds = _request_seeds(counts, sampling_metadata.generators, logits.device)
        random = verify(logits, drafts, draft_probs, temperature=1.0, seed=seeds, **options)
    if random is None:
        return greedy.accept_len, greedy.tokens
    if greedy is None:
        return random.accept_len, random.tokens
    temperature = sampling_metadata.temperature
    if temperature is None:
        raise ValueError("sampling_metadata.temperature is None but the batch is not all greedy")
    is_greedy = temperature.to(logits.device).reshape(-1) == GREEDY_TEMPERATURE
    return (torch.where(is_greedy, greedy.accept_len, random.accept_len),
            torch.where(is_greedy[:, None], greedy.tokens, random.tokens))


def _request_seeds(counts: list, generators: dict, device) -> torch.Tensor:
    """[B] int64 Philox seeds: from each request's own generator where it has one and drafts (vLLM draws nothing for
    a request without drafts either), from torch's default generator of the device otherwise. No host sync."""
    seeds = torch.randint(0, _SEED_HIGH, (len(counts),), dtype=torch.int64, device=device)
    for request, generator in (generators or {}).items():
        if counts[request] > 0:
            seed = torch.randint(0, _SEED_HIGH, (), dtype=torch.int64, device=generator.device, generator=generator)
            seeds[request] = seed.to(device)
    return seeds


def _emitted(tokens: torch.Tensor, accept_len: torch.Tensor, count: torch.Tensor, bonus: torch.Tensor):
    """[B, width + 1] int32: the accepted drafts, then the recovered token, or the bonus token where every draft of
    the request was accepted, then −1."""
    extended = torch.cat([tokens, bonus[:, None]], 1)
    column = torch.arange(extended.shape[1], device=tokens.device)[None, :]
    accept_len = accept_len.to(torch.int64)[:, None]
    extended = torch.where((column == accept_len) & (accept_len == count[:, None]), bonus[:, None], extended)
    return torch.where(column <= accept_len, extended, PLACEHOLDER_TOKEN_ID).to(torch.int32)


def _check(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
           bonus_token_ids) -> list:
    """The shapes vLLM asserts, as ValueErrors naming the argument; returns num_draft_tokens as a list of ints."""
    def integer_tensor(name, value, dims):
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype == torch.bool \
                or value.dim() not in dims:
            raise ValueError(f"{name} must be an integer tensor with {' or '.join(map(str, dims))} dimension(s), got "
                             f"{getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}")

    integer_tensor("draft_token_ids", draft_token_ids, (1,))
    counts = [int(k) for k in num_draft_tokens]
    if any(k < 0 for k in counts):
        raise ValueError(f"num_draft_tokens must be non-negative, got {counts}")
    total = draft_token_ids.shape[0]
    if sum(counts) != total:
        raise ValueError(f"num_draft_tokens sums to {sum(counts)} but draft_token_ids has {total} entries")
    if isinstance(max_spec_len, bool) or not isinstance(max_spec_len, int) or max_spec_len < max(counts, default=0):
        raise ValueError(f"max_spec_len must be an int >= max(num_draft_tokens) = {max(counts, default=0)}, got "
                         f"{max_spec_len!r}")
    integer_tensor("cu_num_draft_tokens", cu_num_draft_tokens, (1,))
    if cu_num_draft_tokens.shape[0] != len(counts):
        raise ValueError(f"cu_num_draft_tokens must have B = {len(counts)} entries, got {cu_num_draft_tokens.shape[0]}")
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 2 or target_logits.shape[0] != total:
        raise ValueError(f"target_logits must be a tensor [num_tokens, V] = [{total}, V], got "
                         f"{tuple(getattr(target_logits, 'shape', ()))}")
    if draft_probs is not None and (not isinstance(draft_probs, torch.Tensor)
                                    or tuple(draft_probs.shape) != tuple(target_logits.shape)):
        raise ValueError(f"draft_probs must be None or a tensor of target_logits' shape {tuple(target_logits.shape)}, "
                         f"got {tuple(getattr(draft_probs, 'shape', ()))}")
    integer_tensor("bonus_token_ids", bonus_token_ids, (1, 2))
    if bonus_token_ids.numel() != len(counts):
        raise ValueError(f"bonus_token_ids must be [B, 1] = [{len(counts)}, 1], got {tuple(bonus_token_ids.shape)}")
    return counts


# ----------------------------------------------------------------------------------------------------------------------
# The vllm.general_plugins entry point
# ----------------------------------------------------------------------------------------------------------------------
def register() -> None:
    """vLLM calls this in each of its processes (entry point ``csd_kernels`` of ``vllm.general_plugins``). With
    ``CSD_KERNELS_VLLM`` unset (or 0) it does nothing; set to a rule (1 = "strict") it rebinds ``rejection_sample``
    wherever vLLM 0.33 looks it up, for V1 (``V1_MODULE``) and for Model Runner V2 (``vllm_mrv2.MRV2_MODULES``); a
    value that names no rule is refused here, in one line."""
    rule = rule_from_env(PLUGIN_ENV)
    if rule is not None:
        install_everywhere(rule)


def install_everywhere(rule: str = "strict") -> list:
    """Imports vLLM's modules that look ``rejection_sample`` up and rebinds the name in each (V1's to
    :func:`rejection_sample`, MRV2's to :func:`.vllm_mrv2.rejection_sample`); the names of those it rebound now.
    Also the body of a ``collective_rpc`` call that swaps the op into a running engine's workers (docs/drop-in.md)."""
    rebound = [V1_MODULE] if install(_vllm_module(V1_MODULE), rule) else []
    for name in vllm_mrv2.MRV2_MODULES:
        if vllm_mrv2.install(_vllm_module(name), rule):
            rebound.append(name)
    return rebound


def _vllm_module(name: str):
    """vLLM's module ``name``; RuntimeError in one line where this vLLM has none (0.34 dropped V1's sampler)."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise RuntimeError(f"{name} does not import ({error}): this vLLM is not the one the plugin knows "
                           "(vLLM 0.33)") from None


def swap_in_worker(worker, rule: str = "strict") -> list:
    """``LLM.collective_rpc(swap_in_worker, kwargs={"rule": rule})`` runs this in each of an engine's workers (vLLM
    hands the worker first): :func:`install_everywhere` in that worker's process, for either runner."""
    del worker
    rule = rule_from_value(rule)
    return [] if rule is None else install_everywhere(rule)


def install(module, rule: str = "strict") -> bool:
    """Rebinds ``module.rejection_sample`` (vLLM's ``vllm.v1.sample.rejection_sampler``) to this package's, with
    ``rule`` and no host sync (``validate=False``); calls in vLLM's synthetic or FLy mode, by keyword or by position,
    go to vLLM's own function. Whether it rebound (False: already done)."""

    def rejection_sample_on_csd_kernels(*args, **kwargs):
        if unsupported(args, kwargs):
            return rejection_sample_on_csd_kernels.csd_kernels_original(*args, **kwargs)
        return rejection_sample(*args, rule=rule, validate=False, **kwargs)

    return rebind(module, "rejection_sample", rejection_sample_on_csd_kernels, ours=rejection_sample)


def unsupported(args: tuple, kwargs: dict) -> bool:
    """Whether a call, given by position or keyword, is in vLLM's synthetic or FLy mode (left to vLLM)."""
    synthetic = args[8] if len(args) > 8 else kwargs.get("synthetic_mode")
    fly_window_size = args[11] if len(args) > 11 else kwargs.get("fly_window_size")
    return bool(synthetic) or fly_window_size is not None
