"""csd_kernels.integrations.sglang against sgl-kernel's own test cases, replayed without importing SGLang.

sgl-kernel/tests/speculative/test_speculative_sampling.py (read at commit 120affb of sgl-project/sglang, a version
whose test spells the keywords retrieve_*; sgl-kernel 0.3.21's wrapper and SGLang 0.5.23's calls spell them
retrive_*, as here) and SGLang's JIT-kernel tests (python/sglang/jit_kernel/tests/test_speculative_sampling.py,
commit 561ab38): the tree table, the threshold boundaries, the smoke ranges. Then a transcription of the kernel's
walk, one row and one node at a time, against the vectorised walk on random trees, and the law of the emitted token.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from csd_kernels.integrations import sglang as adapter
from csd_kernels.integrations.sglang import tree_speculative_sampling_target_only as sample

# sgl-kernel's tree: row 0: root -> 1 (token 1) -> 2; root's second child 3 (token 3) -> 4 -> 5.
#                    row 1: root -> 4 (token 11) -> 5 (token 12); root's second child 1 (token 8) -> 2 -> 3.
CANDIDATES = [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]]
RETRIVE_INDEX = [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
NEXT_TOKEN = [[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]]
NEXT_SIBLING = [[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]]
TABLE_1_1 = ([3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2])


def _sgl_kernel_case(threshold_single, threshold_acc, seed=0):
    logits = torch.full((2, 6, 20), 1.0)
    logits[0, 0, 3] = logits[0, 3, 4] = logits[0, 4, 5] = logits[1, 0, 11] = logits[1, 4, 12] = 10
    peaked = logits.max(-1).values >= 10
    logits[..., 18] = torch.where(peaked, logits[..., 18], 10.0)
    target_probs = F.softmax(logits / 0.01, dim=-1)  # temperature 0.01: p = 0 exactly off the peak in float32
    predicts = torch.full((12,), -1, dtype=torch.int32)
    accept_index = torch.full((2, 4), -1, dtype=torch.int32)
    accept_token_num = torch.zeros(2, dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed)
    sample(predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
           candidates=torch.tensor(CANDIDATES), retrive_index=torch.tensor(RETRIVE_INDEX),
           retrive_next_token=torch.tensor(NEXT_TOKEN), retrive_next_sibling=torch.tensor(NEXT_SIBLING),
           uniform_samples=torch.rand(2, 6, generator=gen),
           uniform_samples_for_final_sampling=torch.rand(2, generator=gen),
           target_probs=target_probs, draft_probs=torch.zeros_like(target_probs),
           threshold_single=threshold_single, threshold_acc=threshold_acc, deterministic=True)
    return predicts.tolist(), accept_index.tolist(), accept_token_num.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_sgl_kernel_table_lossless_thresholds(seed):
    assert _sgl_kernel_case(1, 1, seed) == TABLE_1_1


def test_sgl_kernel_table_zero_thresholds_never_accepts_a_zero_probability_token():
    """sgl-kernel's second case (thresholds 0, 0) expects [1, 2, 18, ...]: its older kernel accepted token 1, whose
    target probability is exactly 0, because p >= threshold_single = 0. SGLang 0.5.23's kernel requires p > 0
    (has_target_mass) and so does the op: the root takes token 3 (p = 1), as with thresholds 1."""
    predicts, accept_index, accept_token_num = _sgl_kernel_case(0, 0)
    assert predicts[0] == 3 and (predicts, accept_index, accept_token_num) == TABLE_1_1


def _chain(batch, nodes, spec, vocab, seed):
    """SGLang's JIT tests' make_inputs: a linear chain (no siblings), candidates i % V, random target_probs equal to
    draft_probs, random coins."""
    torch.manual_seed(seed)
    raw = torch.rand(batch, nodes, vocab)
    target = raw / raw.sum(-1, keepdim=True)
    nxt = torch.arange(1, nodes + 1)
    nxt[-1] = -1
    return dict(predicts=torch.zeros(batch * nodes, dtype=torch.int32),
                accept_index=torch.zeros(batch, spec, dtype=torch.int32),
                accept_token_num=torch.zeros(batch, dtype=torch.int32),
                candidates=(torch.arange(nodes) % vocab).expand(batch, -1).contiguous(),
                retrive_index=torch.arange(nodes).expand(batch, -1).contiguous(),
                retrive_next_token=nxt.expand(batch, -1).contiguous(),
                retrive_next_sibling=torch.full((batch, nodes), -1),
                uniform_samples=torch.rand(batch, nodes), uniform_samples_for_final_sampling=torch.rand(batch),
                target_probs=target, draft_probs=target.clone())


@pytest.mark.parametrize("batch,nodes,spec,vocab", [(1, 4, 4, 32), (2, 8, 5, 64), (4, 16, 8, 128), (1, 1, 1, 32)])
def test_sglang_smoke(batch, nodes, spec, vocab):
    inputs = _chain(batch, nodes, spec, vocab, 42)
    sample(**inputs, threshold_single=0.9, threshold_acc=0.9)
    assert 0 <= int(inputs["accept_token_num"].min()) and int(inputs["accept_token_num"].max()) < spec


@pytest.mark.parametrize("batch", [1, 2])
def test_sglang_accept_all_when_threshold_acc_zero(batch):
    inputs = _chain(batch, 4, 4, 32, 123)
    inputs["uniform_samples"].fill_(0.0)
    sample(**inputs, threshold_single=0.0, threshold_acc=0.0)
    assert (inputs["accept_token_num"] == 3).all()


@pytest.mark.parametrize("batch", [1, 2])
def test_sglang_accept_all_when_threshold_single_zero(batch):
    inputs = _chain(batch, 4, 4, 32, 456)
    sample(**inputs, threshold_single=0.0, threshold_acc=1.0)
    assert (inputs["accept_token_num"] == 3).all()


# ---------------------------------------------------------------------------------------------- the walk itself
def _kernel_walk(inputs, threshold_single, threshold_acc):
    """sgl-kernel's kernel as a plain loop, one row, one node at a time (its control flow; the final draw by
    inverse CDF on float64 sums)."""
    predicts = inputs["predicts"].tolist()
    accept_index = inputs["accept_index"].tolist()
    counts = []
    spec = len(accept_index[0])
    thr_acc = max(threshold_acc, 1e-9)
    for b in range(len(accept_index)):
        cand, ridx = inputs["candidates"][b].tolist(), inputs["retrive_index"][b].tolist()
        nxt, sib = inputs["retrive_next_token"][b].tolist(), inputs["retrive_next_sibling"][b].tolist()
        p, d = inputs["target_probs"][b].double(), inputs["draft_probs"][b].double().clone()
        coins = inputs["uniform_samples"][b].tolist()
        cur, coin, acc, last, accepted = 0, coins[0], 0.0, ridx[0], 0
        accept_index[b][0] = last
        index = 0
        for _ in range(1, spec):
            index = nxt[cur]
            while index != -1:
                x = cand[index]
                px = float(p[cur, x])
                acc += px
                if px > 0 and (coin < acc / thr_acc or px >= threshold_single):
                    acc, predicts[last] = 0.0, x
                    cur, coin, last = index, coins[index], ridx[index]
                    accepted += 1
                    accept_index[b][accepted] = last
                    break
                d[cur, x] = p[cur, x]
                index = sib[index]
            if index == -1:
                break
        counts.append(accepted)
        residual = p[cur] if accepted == spec - 1 else (p[cur] - d[cur]).clamp(min=0)
        cdf = residual.cumsum(0)
        u = float(inputs["uniform_samples_for_final_sampling"][b]) * float(cdf[-1])
        predicts[last] = int((cdf <= u).sum())
    return predicts, accept_index, counts


def _random_tree(batch, nodes, vocab, seed):
    """Random trees in SGLang's encoding: node i > 0 hangs under a random earlier node, siblings in a random order;
    distinct candidate tokens per parent; target_probs from random logits with some exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.full((batch, nodes), -1)
    sib = torch.full((batch, nodes), -1)
    cand = torch.zeros(batch, nodes, dtype=torch.int64)
    for b in range(batch):
        children = {i: [] for i in range(nodes)}
        for i in range(1, nodes):
            children[int(torch.randint(0, i, (1,), generator=gen))].append(i)
        for parent, kids in children.items():
            kids = [kids[j] for j in torch.randperm(len(kids), generator=gen).tolist()]
            tokens = torch.randperm(vocab, generator=gen)[:len(kids)]
            for j, kid in enumerate(kids):
                cand[b, kid] = tokens[j]
                if j == 0:
                    nxt[b, parent] = kid
                else:
                    sib[b, kids[j - 1]] = kid
    logits = torch.randn(batch, nodes, vocab, generator=gen) * 1.5
    logits = logits.masked_fill(torch.rand(batch, nodes, vocab, generator=gen) < 0.2, float("-inf"))
    target = F.softmax(logits, -1)
    return dict(candidates=cand, retrive_index=torch.arange(batch * nodes).reshape(batch, nodes),
                retrive_next_token=nxt, retrive_next_sibling=sib,
                uniform_samples=torch.rand(batch, nodes, generator=gen),
                uniform_samples_for_final_sampling=torch.rand(batch, generator=gen), target_probs=target,
                draft_probs=torch.zeros_like(target))


@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.3, 0.6), (0.0, 0.0)])
@pytest.mark.parametrize("seed", range(6))
def test_walk_equals_the_kernels_loop_on_random_trees(seed, thresholds):
    batch, nodes, spec, vocab = 5, 12, 5, 16
    tree = _random_tree(batch, nodes, vocab, seed)
    outputs = dict(predicts=torch.full((batch * nodes,), -7, dtype=torch.int32),
                   accept_index=torch.full((batch, spec), -7, dtype=torch.int32),
                   accept_token_num=torch.zeros(batch, dtype=torch.int32))
    expected = _kernel_walk({**tree, **{k: v.clone() for k, v in outputs.items()}}, *thresholds)
    sample(**outputs, **tree, threshold_single=thresholds[0], threshold_acc=thresholds[1])
    assert outputs["predicts"].tolist() == expected[0]
    assert outputs["accept_index"].tolist() == expected[1]
    assert outputs["accept_token_num"].tolist() == expected[2]


def _root_law(rule: str, samples: int = 30_000, **options):
    """The token emitted after the root of a 3-child tree (depth 1, S = 2), `samples` rows with fresh coins."""
    vocab = 8
    p = F.softmax(torch.tensor([1.2, -1.5, -1.5, 1.6, -1.5, -2.0, -1.5, 0.6]), -1)
    target = torch.zeros(samples, 4, vocab)
    target[:] = p
    gen = torch.Generator().manual_seed(11)
    outputs = dict(predicts=torch.full((samples * 4,), -1, dtype=torch.int32),
                   accept_index=torch.full((samples, 2), -1, dtype=torch.int32),
                   accept_token_num=torch.zeros(samples, dtype=torch.int32))
    sample(**outputs, candidates=torch.tensor([0, 3, 6, 1]).expand(samples, -1).contiguous(),
           retrive_index=torch.arange(samples * 4).reshape(samples, 4),
           retrive_next_token=torch.tensor([1, -1, -1, -1]).expand(samples, -1).contiguous(),
           retrive_next_sibling=torch.tensor([-1, 2, 3, -1]).expand(samples, -1).contiguous(),
           uniform_samples=torch.rand(samples, 4, generator=gen),
           uniform_samples_for_final_sampling=torch.rand(samples, generator=gen), target_probs=target,
           draft_probs=torch.zeros_like(target), rule=rule, **options)
    return p, torch.bincount(outputs["predicts"].reshape(samples, 4)[:, 0].long(), minlength=vocab).double()


@pytest.mark.parametrize("rule", ["strict", "csd"])
def test_emitted_token_law_chi2(rule):
    """Children 3, 6, 1 of the root (x_1 = 3). strict: the token after the root has law p (RRS with one-hot drafts).
    csd (λ = 0.2): x_1 is accepted with a = min(1, p(x_1) + λH) (TVD(p, one-hot) = 1 − p(x_1) < τ here), and
    otherwise the siblings and the draw follow the residual p without x_1, so out(x_1) = a, out(y) = (1 − a)·p(y)/
    (1 − p(x_1)). 30 000 rows, chi-square 7 df at alpha 1e-4 (critical 25.9); the two laws differ by > 0.5 in L1."""
    from scipy.stats import chi2

    p, counts = _root_law(rule, **({} if rule == "strict" else dict(entropy_coef=0.2)))
    law = p.double().clone()
    if rule == "csd":
        h = -(p * p.log()).sum()
        assert 1 - p[3] < 0.65
        a = min(1.0, float(p[3] + 0.2 * h))
        law = (1 - a) * p.double() / (1 - p[3])
        law[3] = a
        assert (law - p).abs().sum() > 0.5
    samples = counts.sum()
    stat = ((counts - samples * law) ** 2 / (samples * law)).sum().item()
    assert stat < chi2.ppf(1 - 1e-4, 7), stat


def test_bad_input_raises_naming_the_argument():
    inputs = _chain(1, 4, 4, 8, 0)
    for name, bad in (("candidates", inputs["candidates"].int()), ("accept_index", torch.zeros(1, 4)),
                      ("predicts", torch.zeros(3, dtype=torch.int32)), ("draft_probs", torch.zeros(1, 4, 7))):
        with pytest.raises(ValueError, match=name):
            sample(**{**inputs, name: bad})
    with pytest.raises(ValueError, match="threshold_acc"):
        sample(**inputs, threshold_acc=1.5)


def test_the_plugin_rebinds_sglangs_names_only_when_switched_on(monkeypatch):
    modules = {}
    for name in adapter.SGLANG_MODULES:
        module = types.ModuleType(name)
        module.tree_speculative_sampling_target_only = lambda **kw: "sglang's own"
        modules[name] = module
        monkeypatch.setitem(sys.modules, name, module)
    originals = {name: m.tree_speculative_sampling_target_only for name, m in modules.items()}
    monkeypatch.delenv(adapter.PLUGIN_ENV, raising=False)
    adapter.register()
    assert all(m.tree_speculative_sampling_target_only is originals[n] for n, m in modules.items())
    monkeypatch.setenv(adapter.PLUGIN_ENV, "strict")
    adapter.register()
    adapter.register()
    for name, module in modules.items():
        assert module.tree_speculative_sampling_target_only.csd_kernels_original is originals[name]
    inputs = _chain(2, 4, 4, 8, 3)
    modules[adapter.SGLANG_MODULES[1]].tree_speculative_sampling_target_only(**inputs, threshold_single=0.0)
    assert (inputs["accept_token_num"] == 3).all()
