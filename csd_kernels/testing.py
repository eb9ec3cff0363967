"""Inputs and checks shared by every backend test and by the benchmarks: one case factory, one comparison with the
reference. (Public so that users can hold their own backends or builds to the same cases.)"""

from __future__ import annotations

from typing import Optional

import torch

from . import reference as ref
from .config.acceptance import rule_named
from .ops.checks import check_distortion, check_rule
from .ops.verify import OpSettings, VerifyArgs

__all__ = ["make_case", "reference_result", "backend_args", "compare", "rule_inputs", "STAT_NAMES"]

STAT_NAMES = ("probs", "entropy", "tvd", "accept_prob", "distortion")
Q_KINDS = ("dense", "jacobi", "sparse", "uniform", "row", None)


def make_case(batch: int, length: int, vocab: int, *, dtype: torch.dtype = torch.float32, cfg: bool = True,
              q: Optional[str] = "dense", strided: bool = False, scale: float = 2.0, int_logits: bool = False,
              from_q: float = 0.8, favourite: float = 0.0, start: int = 0, seed_rows: bool = False,
              bad_tokens: bool = False, seed: int = 0, device="cpu") -> dict:
    """The tensor arguments of :func:`csd_kernels.verify` for one random window, as keywords.

    Shape: target_logits / uncond_logits [B, L, V] (uncond None without ``cfg``; ``strided``: the halves of one
    interleaved CFG batch, window positions strided too), draft_tokens [B, L], draft_probs [B, L, V] or None, start /
    positions [B], seed [1] or [B] (``seed_rows``), offset [1].
    q: "dense" (a random softmax), "jacobi" (p of the same mixed logits plus noise: TVD(p, q) small, the CSD gate
    open), "sparse" (half the entries 0), "uniform" (1/V, stride 0), "row" (one q row for every position, stride 0 on
    B and L) or None (one-hot drafts). A fraction ``from_q`` of the drafts is sampled from q, the rest is random in
    [-1, V) (all of them without a dense q); a fraction ``favourite`` is then the target's argmax, so that rows accept
    a few positions. ``int_logits``: small integers
    (many exact ties, ±0). ``bad_tokens``: out-of-range drafts in every row (V at the first position, -7 at the last).
    """
    g = torch.Generator().manual_seed(seed)
    cond, uncond = _logits(g, batch, length, vocab, dtype, cfg, strided, scale, int_logits)
    probs = _draft_probs(g, q, cond, uncond, scale)
    drafts = _drafts(g, probs if q not in ("uniform", "row") else None, cond, vocab, from_q, favourite)
    if bad_tokens:
        drafts = drafts.clone()
        drafts[:, 0] = vocab
        drafts[:, -1] = -7
    case = dict(target_logits=cond, draft_tokens=drafts, draft_probs=probs, uncond_logits=uncond,
                start=torch.full((batch,), start, dtype=torch.int64),
                positions=torch.randint(0, 2**32, (batch,), generator=g, dtype=torch.int64),
                seed=torch.randint(0, 2**62, (batch if seed_rows else 1,), generator=g, dtype=torch.int64),
                offset=torch.randint(0, 2**62, (1,), generator=g, dtype=torch.int64))
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def _logits(g, batch, length, vocab, dtype, cfg, strided, scale, int_logits):
    def draw(rows, positions):
        if int_logits:  # many exact ties, including -0.0 against +0.0
            x = torch.randint(-2, 3, (rows, positions, vocab), generator=g).float()
            return torch.where(torch.rand(x.shape, generator=g) < 0.3, -0.0 * x.abs(), x).to(dtype)
        return (torch.randn(rows, positions, vocab, generator=g) * scale).to(dtype)

    if not strided:
        return draw(batch, length), draw(batch, length) if cfg else None
    both = draw(2 * batch, 2 * length)  # [cond; uncond] rows interleaved, window positions strided
    return both[0::2, ::2], both[1::2, ::2] if cfg else None


def _draft_probs(g, q, cond, uncond, scale):
    batch, length, vocab = cond.shape
    if q is None:
        return None
    if q == "uniform":
        return torch.full((1, 1, 1), 1.0 / vocab).expand(batch, length, vocab)
    if q == "row":
        return torch.softmax(torch.randn(vocab, generator=g) * scale, -1).expand(batch, length, vocab)
    if q == "jacobi":
        mixed = cond.float() if uncond is None else uncond.float() + 5.0 * (cond.float() - uncond.float())
        return torch.softmax(mixed + 0.5 * torch.randn(mixed.shape, generator=g), -1)
    probs = torch.softmax(torch.randn(batch, length, vocab, generator=g) * scale, -1)
    if q == "sparse":  # zeros in q: invalid drafts at some positions, residual mass elsewhere
        probs = torch.where(torch.rand(probs.shape, generator=g) < 0.5, torch.zeros_like(probs), probs)
        probs[..., 0] = torch.where(probs.sum(-1) > 0, probs[..., 0], 1.0)  # never an all-zero row
        probs = probs / probs.sum(-1, keepdim=True)  # q rows must sum to 1
    elif q != "dense":
        raise ValueError(f"q must be one of {Q_KINDS}, got {q!r}")
    return probs


def _drafts(g, probs, cond, vocab, from_q, favourite):
    batch, length = cond.shape[:2]
    drafts = torch.randint(-1, vocab, (batch, length), generator=g)
    if probs is not None and vocab > 1:
        sampled = torch.multinomial(probs.reshape(-1, vocab).clamp(min=1e-30), 1, generator=g).reshape(batch, length)
        drafts = torch.where(torch.rand(batch, length, generator=g) < from_q, sampled, drafts)
    if favourite:
        drafts = torch.where(torch.rand(batch, length, generator=g) < favourite, cond.float().argmax(-1), drafts)
    return drafts


def rule_inputs(rule: str, vocab: int, *, k: int = 3, seed: int = 0) -> dict:
    """What ``rule`` needs besides its parameters, for a test over every rule: the exact distortion of the rules that
    compute it on request (``gather_distortion=True``: gsd, lantern, lantern++; NaN otherwise) and the lantern
    rules' neighbour table (``neighbours=``) of a random codebook [V, 3], k = min(k, V − 1) nearest codes (V = 1: one
    entry outside [0, V), which lends nothing); {} for the other rules."""
    spec = rule_named(rule)
    out = {"gather_distortion": True} if spec.distortion_gathers else {}
    if spec.needs_neighbours and vocab < 2:
        out["neighbours"] = torch.full((vocab, 1), -1, dtype=torch.int64)
    elif spec.needs_neighbours:
        codebook = torch.randn(vocab, 3, generator=torch.Generator().manual_seed(seed))
        out["neighbours"] = ref.codebook_neighbours(codebook, min(k, vocab - 1))
    return out


def reference_result(case: dict, **options) -> ref.VerifyResult:
    """reference.verify (float32, on the CPU) of a case and verify() options (rule, coupling, cfg_scale, ...)."""
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    options = dict(options)
    options.setdefault("cfg_scale", 1.0)
    if options.get("max_distortion", 0.0) is None:  # verify's None: no cap
        del options["max_distortion"]
    return ref.verify(**cpu, **options, compute_dtype=torch.float32)


def backend_args(case: dict, *, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, min_p: Optional[float] = None, rule: str = "csd",
                 neighbours: Optional[torch.Tensor] = None, gather_distortion: bool = False,
                 coupling: str = "independent", return_probs: bool = True, target_is_probs: bool = False,
                 words: Optional[tuple] = None, informed: Optional[torch.Tensor] = None,
                 max_distortion: Optional[float] = None, **rule_params) -> VerifyArgs:
    """The backend functions' argument tuple (backends/spec.py) of a case and verify() options, as ops.verify builds
    it (the rule checked by the table); ``words``: (seed, offset) in place of the case's tensors."""
    vocab = case["target_logits"].shape[-1]
    rule_args = check_rule(rule, rule_params, neighbours, vocab, case["target_logits"].device)
    seed, offset = words or (case["seed"], case["offset"])
    gather_distortion, cap = check_distortion(rule, gather_distortion, max_distortion)
    settings = OpSettings(cfg_scale=cfg_scale, temperature=temperature, top_p=1.0 if top_p is None else top_p,
                        min_p=min_p or 0.0, max_distortion=cap, top_k=top_k or 0, rule=rule_args.code,
                        coupling=ref.COUPLINGS.index(coupling), target_is_probs=target_is_probs,
                        gather_distortion=gather_distortion, return_probs=return_probs, rule_params=rule_args.params)
    return VerifyArgs(target_logits=case["target_logits"], draft_tokens=case["draft_tokens"],
                      draft_probs=case["draft_probs"], uncond_logits=case.get("uncond_logits"),
                      neighbours=rule_args.neighbours, informed=informed, start=case["start"],
                      positions=case["positions"], seed=seed, offset=offset, settings=settings.floats(),
                      choices=settings.ints())


def compare(got: ref.VerifyResult, expected: ref.VerifyResult, *, exact: bool = True, rtol: float = 1e-4,
            atol: float = 1e-5) -> int:
    """Asserts that a backend's result equals the reference's: status always; accept_len and tokens exactly (or,
    with ``exact=False``, counts the rows where a float tie split them); the statistics within rtol / atol on the
    rows that agree; tokens always in range. Returns the number of rows that differ."""
    vocab = got.probs.shape[-1] if got.probs is not None and got.probs.numel() else None
    tokens, accept_len = got.tokens.cpu(), got.accept_len.cpu()
    assert torch.equal(got.status.cpu(), expected.status.to(torch.int32))
    differ = (accept_len != expected.accept_len.to(torch.int32)) | (tokens != expected.tokens).any(-1)
    if exact:
        assert not differ.any(), (accept_len, expected.accept_len, tokens, expected.tokens)
    same = ~differ
    for name in STAT_NAMES:
        a, b = getattr(got, name), getattr(expected, name)
        if b is None or a is None or a.numel() == 0:
            assert (a is None or a.numel() == 0) == (b is None), name
            continue
        torch.testing.assert_close(a.cpu()[same], b.to(torch.float32)[same], rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert (tokens >= 0).all() and (vocab is None or (tokens < vocab).all()), "a token out of range"
    return int(differ.sum())
