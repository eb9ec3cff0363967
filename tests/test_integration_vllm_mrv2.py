"""csd_kernels.integrations.vllm_mrv2 (vLLM Model Runner V2's rejection_sample) and the vLLM plugin for both runners.

Without vLLM: the adapter against a torch transcription of MRV2's kernels (vllm 0.33.0,
vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py: greedy rows, the lossless test, the bonus slot, the layout),
its signature against a recorded copy of vLLM 0.33's, the hand-back of what it does not implement, and the plugin on
fake vllm modules shaped like 0.33's. scripts/engines_check.sh runs the real engines' own tests (docs/drop-in.md).
"""

from __future__ import annotations

import inspect
import sys
import types
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from csd_kernels.integrations import vllm as v1
from csd_kernels.integrations import vllm_mrv2 as mrv2

_E = inspect.Parameter.empty
_P, _K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
# inspect.signature of vLLM 0.33.0's functions (name, kind, default), read from the installed wheel
MRV2_SIGNATURE = [("target_logits", _P, _E), ("draft_logits", _P, _E), ("draft_sampled", _P, _E),
                  ("cu_num_logits", _P, _E), ("pos", _P, _E), ("idx_mapping", _P, _E),
                  ("expanded_idx_mapping", _P, _E), ("expanded_local_pos", _P, _E), ("temperature", _P, _E),
                  ("seed", _P, _E), ("num_speculative_steps", _P, _E), ("synthetic_conditional_rates", _P, None),
                  ("use_fp64", _P, False), ("use_block_verification", _P, False), ("contexts", _P, None),
                  ("watermarking", _P, None), ("watermarking_skip_mask", _P, None), ("watermark_key", _P, None),
                  ("fly_window_size", _P, 0), ("fly_entropy_threshold", _P, 0.3), ("fly_entropy_top_k", _P, 3)]
V1_SIGNATURE = [("draft_token_ids", _P, _E), ("num_draft_tokens", _P, _E), ("max_spec_len", _P, _E),
                ("cu_num_draft_tokens", _P, _E), ("draft_probs", _P, _E), ("target_logits", _P, _E),
                ("bonus_token_ids", _P, _E), ("sampling_metadata", _P, _E), ("synthetic_mode", _P, False),
                ("synthetic_conditional_rates", _P, None), ("use_fp64_gumbel", _P, False),
                ("fly_window_size", _P, None), ("fly_entropy_threshold", _P, None), ("fly_entropy_top_k", _P, 3)]


@pytest.mark.parametrize("function, recorded", [(mrv2.rejection_sample, MRV2_SIGNATURE),
                                                (v1.rejection_sample, V1_SIGNATURE)])
def test_the_signature_is_vllms_then_ours_keyword_only(function, recorded):
    params = list(inspect.signature(function).parameters.values())
    assert [(p.name, p.kind, p.default) for p in params[:len(recorded)]] == recorded
    assert all(p.kind in (_K, inspect.Parameter.VAR_KEYWORD) for p in params[len(recorded):])


# ------------------------------------------------------------------------------------------------ MRV2's layout
def _batch(drafts: list, vocab: int, steps: int, *, temperature, seed=None, idx_mapping=None, pos0=None,
           draft_logits=False, generator=None):
    """MRV2's inputs for requests with the given draft lists: request r owns k_r + 1 logits rows; draft_sampled holds
    the last committed token (here 0) then the drafts; state rows are idx_mapping (default r) in a max_num_reqs of
    num_reqs + 2 (unused rows poisoned)."""
    g = generator or torch.Generator().manual_seed(0)
    num_reqs = len(drafts)
    counts = [len(d) + 1 for d in drafts]
    cu = torch.tensor([0] + counts).cumsum(0).to(torch.int32)
    draft_sampled = torch.tensor(sum(([0] + d for d in drafts), []), dtype=torch.int64)
    idx = torch.tensor(idx_mapping if idx_mapping is not None else list(range(num_reqs)), dtype=torch.int32)
    max_reqs = num_reqs + 2
    temp = torch.full((max_reqs,), float("nan"))
    temp[idx.long()] = torch.as_tensor(temperature, dtype=torch.float32)
    seeds = torch.full((max_reqs,), -7, dtype=torch.int64)
    seeds[idx.long()] = torch.as_tensor(seed if seed is not None else list(range(num_reqs)), dtype=torch.int64)
    start = torch.as_tensor(pos0 if pos0 is not None else [10 * r for r in range(num_reqs)], dtype=torch.int64)
    pos = torch.cat([start[r] + torch.arange(c) for r, c in enumerate(counts)])
    expanded_idx = torch.repeat_interleave(idx, torch.tensor(counts))
    local = torch.cat([torch.arange(c) for c in counts]).to(torch.int32)
    logits = torch.randn(int(cu[-1]), vocab, generator=g) * 2
    dl = torch.randn(max_reqs, steps, vocab, generator=g) * 2 if draft_logits else None
    return [logits, dl, draft_sampled, cu, pos, idx, expanded_idx, local, temp, seeds, steps]


def _transcription_greedy(args):
    """MRV2's greedy path, one request at a time: accept while the draft is the argmax; then the argmax."""
    logits, _, draft_sampled, cu, _, _, _, _, _, _, steps = args
    rows = []
    for r in range(cu.shape[0] - 1):
        start, end = int(cu[r]), int(cu[r + 1])
        out = []
        for i in range(end - start - 1):
            top = int(logits[start + i].argmax())
            out.append(top)
            if int(draft_sampled[start + i + 1]) != top:
                break
        else:
            out.append(int(logits[end - 1].argmax()))  # the bonus position, plain argmax at temperature 0
        rows.append(out)
    return rows


def _layout(sampled, num_sampled, steps):
    assert sampled.dtype == torch.int64 and num_sampled.dtype == torch.int32
    assert sampled.shape == (num_sampled.shape[0], steps + 1)
    rows = []
    for r in range(sampled.shape[0]):
        n = int(num_sampled[r])
        assert (sampled[r, n:] == mrv2.PLACEHOLDER_TOKEN_ID).all()
        rows.append(sampled[r, :n].tolist())
    return rows


@pytest.mark.parametrize("rule", ["strict", "csd"])
@pytest.mark.parametrize("draft_logits", [False, True])
def test_greedy_rows_are_mrv2s_argmax_path(rule, draft_logits):
    """Ragged counts (0 to 4 drafts of 4), drafts copied from the argmax up to a planted mismatch, a −1 draft,
    state rows out of order: every row as the transcription, under every rule (p is one-hot at temperature 0)."""
    vocab, steps = 50, 4
    args = _batch([[0] * 4, [0] * 2, [], [0] * 3, [0] * 4], vocab, steps, temperature=[0.0] * 5,
                  idx_mapping=[3, 0, 6, 1, 2], draft_logits=draft_logits)
    logits, draft_sampled, cu = args[0], args[2], args[3]
    for r in range(5):  # drafts = argmax, then plant a mismatch in requests 1 (first draft) and 3 (third), -1 in 4
        for i in range(int(cu[r + 1] - cu[r]) - 1):
            draft_sampled[int(cu[r]) + i + 1] = int(logits[int(cu[r]) + i].argmax())
    draft_sampled[int(cu[1]) + 1] = (draft_sampled[int(cu[1]) + 1] + 1) % vocab
    draft_sampled[int(cu[3]) + 3] = (draft_sampled[int(cu[3]) + 3] + 1) % vocab
    draft_sampled[int(cu[4]) + 2] = -1
    out = mrv2.rejection_sample(*args, rule=rule)
    assert _layout(*out, steps) == _transcription_greedy(args)
    assert [int(n) for n in out[1]] == [5, 1, 1, 3, 2]


def test_the_view_path_and_the_gather_path_agree():
    """Every request with S + 1 logits takes the view path; the same rows with request 0 cut to one draft take the
    gather path: request 1's tokens are the same, and each batch is the transcription's."""
    vocab, steps = 30, 3
    full = _batch([[0] * 3, [0] * 3], vocab, steps, temperature=[0.0, 0.0])
    full[2][1:4], full[2][5:8] = full[0][0:3].argmax(-1), full[0][4:7].argmax(-1)  # every draft accepted
    rows = torch.tensor([0, 1, 4, 5, 6, 7])
    ragged = list(full)
    for i in (0, 2, 4, 6, 7):  # the per-logit tensors
        ragged[i] = full[i][rows]
    ragged[2] = ragged[2].clone()
    ragged[2][1] = full[0][0].argmax()
    ragged[3] = torch.tensor([0, 2, 6], dtype=torch.int32)
    both, cut = _layout(*mrv2.rejection_sample(*full), steps), _layout(*mrv2.rejection_sample(*ragged), steps)
    assert both == _transcription_greedy(full) and cut == _transcription_greedy(ragged)
    assert both[1] == cut[1] and len(both[0]) == 4 and len(cut[0]) == 2


def _first_token_law(p, q, rule):
    """The law of the first emitted token when the draft comes from q: strict gives p; csd (docs/op.md) gives
    q·a + (1 − Σq·a)·norm(max(p − q, 0)) with a = min(1, p/q + λH) where TVD(p, q) < τ."""
    h, tvd = -(p * p.clamp_min(1e-30).log()).sum(), 0.5 * (p - q).abs().sum()
    a = torch.clamp(p / q + (0.5 * h if (rule == "csd" and tvd < 0.65) else 0.0), max=1.0)
    residual = (p - q).clamp(min=0)
    return (q * a + (1 - (q * a).sum()) * residual / residual.sum()).double()


@pytest.mark.parametrize("rule, draft_logits", [("strict", True), ("strict", False), ("csd", True)])
def test_random_rows_have_the_rules_law_chi2(rule, draft_logits):
    """20 000 requests, one draft each from q (softmax(draft_logits / T) or one-hot), target logits already divided
    by T = 0.7, per-request seeds: the first token's histogram against the law (chi-square, 9 df, alpha 1e-4)."""
    from scipy.stats import chi2

    vocab, samples, temp = 10, 20_000, 0.7
    g = torch.Generator().manual_seed(5)
    draft_row = torch.randn(vocab, generator=g)
    target_row = torch.randn(vocab, generator=g) * 0.4
    q = F.softmax(draft_row / temp, -1) if draft_logits else None
    p = F.softmax(target_row, -1)
    drafts = torch.multinomial(q if draft_logits else F.softmax(torch.randn(vocab, generator=g), -1), samples,
                               replacement=True, generator=g)
    args = _batch([[int(d)] for d in drafts], vocab, 1, temperature=[temp] * samples, draft_logits=draft_logits)
    args[0] = target_row.repeat(2 * samples, 1)
    if draft_logits:
        args[1] = draft_row.repeat(samples + 2, 1, 1)
    sampled, num_sampled = mrv2.rejection_sample(*args, rule=rule)
    assert ((num_sampled == 1) | (num_sampled == 2)).all()
    # strict: p whatever q (one-hot q at x: x with p(x), else y from p without x, i.e. p(y)); csd: its closed form
    law = _first_token_law(p, q, rule) if rule == "csd" else p.double()
    if rule == "csd":
        assert (law - p).abs().sum() > 0.05  # the two laws are told apart at this sample size
    counts = torch.bincount(sampled[:, 0], minlength=vocab).double()
    stat = ((counts - samples * law) ** 2 / (samples * law)).sum().item()
    assert stat < chi2.ppf(1 - 1e-4, vocab - 1), stat


def test_a_request_repeats_with_its_seed_and_position_wherever_it_is():
    """vLLM keys a request's draws by (seed, pos): the same request, alone or second in a batch with another state
    row, gives the same tokens; another seed, or another position, changes them."""
    vocab, steps = 40, 3
    args = _batch([[1, 2, 3], [4, 5, 6]], vocab, steps, temperature=[1.0, 1.0], seed=[11, 12], pos0=[5, 9],
                  draft_logits=True)
    runs = [_layout(*mrv2.rejection_sample(*args), steps)[1] for _ in range(3)]
    alone = _batch([[4, 5, 6]], vocab, steps, temperature=[1.0], seed=[12], pos0=[9], idx_mapping=[2],
                   draft_logits=True)
    alone[0] = args[0][4:]
    alone[1][2] = args[1][1]
    assert runs[0] == runs[1] == runs[2] == _layout(*mrv2.rejection_sample(*alone), steps)[0]
    for change in ("seed", "pos"):  # either key changes the draws
        changed = []
        for s in range(12):
            moved = list(args)
            if change == "seed":
                moved[9] = args[9].clone()
                moved[9][1] = 100 + s
            else:
                moved[4] = args[4].clone()
                moved[4][4:] += 1 + s
            changed.append(_layout(*mrv2.rejection_sample(*moved), steps)[1])
        assert any(c != runs[0] for c in changed), change


def test_a_mixed_batch_takes_each_rows_path_and_a_negative_seed_is_a_seed():
    vocab, steps = 30, 2
    args = _batch([[1, 2], [3, 4]], vocab, steps, temperature=[0.0, 1.0], seed=[-5, -(1 << 62)])
    sampled, num_sampled = mrv2.rejection_sample(*args)
    assert _layout(sampled, num_sampled, steps)[0] == _transcription_greedy(args)[0]
    assert 1 <= int(num_sampled[1]) <= 3 and (sampled[1, :int(num_sampled[1])] >= 0).all()


def test_a_padded_target_vocabulary_is_cut_to_the_drafts():
    """vLLM verifies on min(V_target, V_draft): a target argmax in the padding is never emitted."""
    vocab, steps = 20, 1
    args = _batch([[3]], vocab, steps, temperature=[0.0], draft_logits=True)
    args[0] = torch.cat([args[0], torch.full((2, 5), 50.0)], 1)
    sampled, num_sampled = mrv2.rejection_sample(*args)
    assert (sampled[0, :int(num_sampled[0])] < vocab).all()


def test_bad_input_raises_naming_the_argument():
    args = _batch([[1, 2]], 10, 2, temperature=[1.0])
    cases = [(0, torch.randn(3, 4, 10), "target_logits"), (2, torch.zeros(2, dtype=torch.int64), "draft_sampled"),
             (3, torch.tensor([0, 3, 3]), "cu_num_logits"), (4, torch.zeros(3), "pos"),
             (1, torch.randn(3, 1, 10), "draft_logits"), (10, -1, "num_speculative_steps")]
    for index, value, name in cases:
        bad = list(args)
        bad[index] = value
        with pytest.raises(ValueError, match=name):
            mrv2.rejection_sample(*bad)


# ------------------------------------------------------------------------------------------------ hand-back
UNSUPPORTED = [("synthetic_conditional_rates", 11, torch.ones(2)), ("use_block_verification", 13, True),
               ("contexts", 14, torch.zeros(3, 1, dtype=torch.int64)), ("watermarking", 15, torch.ones(1).bool()),
               ("watermark_key", 17, 7), ("fly_window_size", 18, 2)]


@pytest.mark.parametrize("name, position, value", UNSUPPORTED)
def test_what_ours_does_not_do_raises_directly(name, position, value):
    args = _batch([[1, 2]], 10, 2, temperature=[1.0])
    with pytest.raises(NotImplementedError, match="vLLM's"):
        mrv2.rejection_sample(*args, **{name: value})
    positional = args + [None, False, False, None, None, None, None, 0]
    positional[position] = value
    with pytest.raises(NotImplementedError, match="vLLM's"):
        mrv2.rejection_sample(*positional)


def _recording(name, calls, signature):
    """A stand-in for vLLM's function with its recorded signature, recording its calls."""
    def rejection_sample(*args, **kwargs):
        calls.append((name, args, kwargs))
        return "vllm's own"
    rejection_sample.__signature__ = inspect.Signature([inspect.Parameter(n, k, default=d) for n, k, d in signature])
    return rejection_sample


def _fake_vllm(monkeypatch):
    """vllm 0.33's modules that look rejection_sample up, each with a recording function, in sys.modules before the
    plugin loads (as in a process that imported vLLM first)."""
    calls = []
    modules = {name: types.ModuleType(name) for name in (v1.V1_MODULE,) + mrv2.MRV2_MODULES}
    for name, module in modules.items():
        module.rejection_sample = _recording(name, calls, V1_SIGNATURE if name == v1.V1_MODULE else MRV2_SIGNATURE)
    for name in list(modules):
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in modules:
                modules[parent] = types.ModuleType(parent)
    for name, module in sorted(modules.items()):
        monkeypatch.setitem(sys.modules, name, module)
        if "." in name:
            parent, child = name.rsplit(".", 1)
            monkeypatch.setattr(modules[parent], child, module, raising=False)
    return modules, calls


def test_the_plugin_rebinds_every_module_vllm_looks_the_name_up_in(monkeypatch):
    modules, _ = _fake_vllm(monkeypatch)
    originals = {name: modules[name].rejection_sample for name in (v1.V1_MODULE,) + mrv2.MRV2_MODULES}
    monkeypatch.setenv(v1.PLUGIN_ENV, "csd")
    v1.register()
    v1.register()  # idempotent
    for name, original in originals.items():
        assert modules[name].rejection_sample.csd_kernels_original is original, name
    args = _batch([[1, 2], []], 10, 2, temperature=[0.0, 0.0])
    for name in mrv2.MRV2_MODULES:
        sampled, num_sampled = modules[name].rejection_sample(*args)
        assert _layout(sampled, num_sampled, 2) == _transcription_greedy(args)


@pytest.mark.parametrize("name, position, value", UNSUPPORTED)
def test_the_plugin_hands_mrv2s_own_features_to_vllm_by_keyword_and_by_position(monkeypatch, name, position, value):
    modules, calls = _fake_vllm(monkeypatch)
    monkeypatch.setenv(v1.PLUGIN_ENV, "1")
    v1.register()
    function = modules[mrv2.MRV2_MODULES[1]].rejection_sample
    args = _batch([[1, 2]], 10, 2, temperature=[1.0])
    assert function(*args, **{name: value}) == "vllm's own"
    positional = args + [None, False, False, None, None, None, None, 0]
    positional[position] = value
    assert function(*positional) == "vllm's own" and len(calls) == 2


@pytest.mark.parametrize("keyword, position, value", [("synthetic_mode", 8, True), ("fly_window_size", 11, 2)])
def test_the_plugin_hands_v1s_synthetic_and_fly_to_vllm_by_position_too(monkeypatch, keyword, position, value):
    modules, calls = _fake_vllm(monkeypatch)
    monkeypatch.setenv(v1.PLUGIN_ENV, "1")
    v1.register()
    args = [torch.tensor([1]), [1], 1, torch.tensor([1]), None, torch.randn(1, 5), torch.tensor([[2]]),
            SimpleNamespace(all_greedy=True, all_random=False, generators={}, temperature=None),
            False, None, False, None, None, 3]
    args[position] = value
    assert modules[v1.V1_MODULE].rejection_sample(*args) == "vllm's own"
    assert calls and calls[0][0] == v1.V1_MODULE


@pytest.mark.parametrize("value", ["cds", "strict2", "2"])
def test_a_bad_value_is_refused_in_one_line_when_the_plugin_loads(monkeypatch, value):
    modules, _ = _fake_vllm(monkeypatch)
    original = modules[v1.V1_MODULE].rejection_sample
    monkeypatch.setenv(v1.PLUGIN_ENV, value)
    with pytest.raises(ValueError) as error:
        v1.register()
    message = str(error.value)
    assert "\n" not in message and f"CSD_KERNELS_VLLM={value!r}" in message and "strict" in message
    assert modules[v1.V1_MODULE].rejection_sample is original


def test_a_vllm_whose_function_has_another_signature_is_refused_in_one_line(monkeypatch):
    """vLLM 0.34's MRV2 function renamed draft_logits to draft_logits_cache and added skip_masked_vocab_blocks: the
    plugin refuses to rebind it (one line naming the module) instead of failing at the engine's first step."""
    modules, calls = _fake_vllm(monkeypatch)
    changed = [(("draft_logits_cache", k, d) if n == "draft_logits" else (n, k, d)) for n, k, d in MRV2_SIGNATURE]
    changed.append(("skip_masked_vocab_blocks", _P, False))
    modules[mrv2.MRV2_MODULES[0]].rejection_sample = _recording("x", calls, changed)
    monkeypatch.setenv(v1.PLUGIN_ENV, "strict")
    with pytest.raises(RuntimeError) as error:
        v1.register()
    assert "\n" not in str(error.value) and mrv2.MRV2_MODULES[0] in str(error.value)
    assert "draft_logits_cache" in str(error.value) and "not the one the plugin knows" in str(error.value)


def test_a_vllm_without_one_of_the_modules_is_refused_in_one_line(monkeypatch):
    """vLLM 0.34 has no vllm.v1.sample.rejection_sampler: one line naming it, not a traceback from the import."""
    _fake_vllm(monkeypatch)
    monkeypatch.setitem(sys.modules, v1.V1_MODULE, None)  # import raises ImportError
    monkeypatch.setenv(v1.PLUGIN_ENV, "strict")
    with pytest.raises(RuntimeError, match=f"^{v1.V1_MODULE} does not import .*not the one the plugin knows") as error:
        v1.register()
    assert "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------ a running engine
class _StubWorker:
    """vLLM's Worker as collective_rpc sees it: the callable gets the worker first."""

    model_runner = SimpleNamespace()


class _StubLLM:
    """vllm.LLM's shape for collective_rpc: llm.collective_rpc -> llm_engine.collective_rpc -> run_method on each
    worker (vllm/v1/serial_utils.run_method: functools.partial(method, worker)(*args, **kwargs))."""

    def __init__(self, workers=2):
        self.llm_engine = SimpleNamespace(collective_rpc=self._rpc)
        self.workers = [_StubWorker() for _ in range(workers)]

    def _rpc(self, method, timeout=None, args=(), kwargs=None):
        return [method(worker, *args, **(kwargs or {})) for worker in self.workers]

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)


def test_the_drop_in_swap_into_an_engine_object(monkeypatch):
    """docs/drop-in.md's lines: LLM(...).collective_rpc(swap_in_worker, kwargs={"rule": ...}) rebinds both runners'
    names in the workers' processes; the first worker rebinds, the second finds it done."""
    modules, _ = _fake_vllm(monkeypatch)
    monkeypatch.delenv(v1.PLUGIN_ENV, raising=False)
    from csd_kernels.integrations.vllm import swap_in_worker

    llm = _StubLLM()
    rebound = llm.collective_rpc(swap_in_worker, kwargs={"rule": "csd"})
    assert rebound == [[v1.V1_MODULE, *mrv2.MRV2_MODULES], []]
    args = _batch([[1, 2]], 10, 2, temperature=[0.0])
    out = modules[mrv2.MRV2_MODULES[1]].rejection_sample(*args)
    assert _layout(*out, 2) == _transcription_greedy(args)
    with pytest.raises(ValueError, match="names no csd_kernels rule"):
        llm.collective_rpc(swap_in_worker, kwargs={"rule": "nope"})
