"""The Triton tree verification (csd_kernels/backends/triton/verify_tree.py) against reference.verify_tree.

Random trees with realistic candidates (main drafts ~ q, siblings Gumbel-top-K of sibling_q): tokens, path and
accept_len exactly, the float fields to 1e-5. On CPU through Triton's interpreter (conftest), so sizes stay small;
the kernel's sm_90 compile is checked in a subprocess with the interpreter off.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from csd_kernels import reference as ref  # noqa: E402
from csd_kernels.backends.spec import OpSettings, TreeArgs  # noqa: E402
from csd_kernels.backends.triton.verify_tree import verify_tree_triton  # noqa: E402
from csd_kernels.ops.checks import check_rule  # noqa: E402
from csd_kernels.testing import rule_inputs  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton on CPU needs TRITON_INTERPRET=1 before triton is imported", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(0) inside the interpreter

FIELDS = ("accept_len", "path", "tokens", "accept_prob", "entropy", "tvd", "distortion", "status")


def _case(branching, depth, slots, vocab, batch=4, seed=0, spread=0.6, cfg=False, siblings=False, missing=False,
          masked=False, restrict=None, dtype=torch.float32):
    """Inputs of one tree verification: the slots' logits share a row base (so drafts are often accepted), q and
    sibling_q are noisy copies of it (restricted as ``restrict``, verify_tree's top_k / top_p / min_p / temperature,
    says, so that drafts fall in p's support), main drafts ~ q, siblings Gumbel-top-K of sibling_q without the main
    draft; the logits in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    layout = ref.tree_layout(branching, depth, slots)
    levels = layout.levels

    def noisy(shape, scale):
        return torch.randn(*shape, generator=g) * scale

    base = noisy((batch, 1, vocab), 2.0)
    logits = base + noisy((batch, slots, vocab), spread)
    if masked:  # a few tokens masked everywhere (−inf), as image generators mask text tokens
        logits[..., : vocab // 5] = float("-inf")
    q = torch.softmax(base + noisy((batch, levels, vocab), spread), -1)
    if restrict:
        r = dict(dict(top_k=None, top_p=None, min_p=None, temperature=1.0), **restrict)
        q = ref.target_distribution(torch.log(q), None, 1.0, r["temperature"], r["top_k"], torch.float32, r["top_p"],
                                    r["min_p"]).p
    if masked:
        q = torch.softmax(torch.log(q).masked_fill(torch.arange(vocab) < vocab // 8, float("-inf")), -1)
    sib = torch.softmax(base + noisy((batch, levels, vocab), 1.5 * spread), -1) if siblings else None
    main = ref.inverse_cdf_sample(q, torch.rand(batch, levels, generator=g))
    uniforms = ref.tree_gumbel_uniforms(torch.tensor([seed + 100]), torch.tensor([3]), batch, levels, vocab)
    cand = ref.tree_candidates(main, q if sib is None else sib, branching, uniforms)
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), cand[:, layout.depth[1:] - 1, layout.rank[1:]]], 1)
    if missing:  # drop about a quarter of the candidates (main drafts included)
        tokens[:, 1:] = torch.where(torch.rand(batch, slots - 1, generator=g) < 0.25, -1, tokens[:, 1:])
    kw = dict(uncond_logits=base + noisy((batch, slots, vocab), spread) if cfg else None, cfg_scale=1.5 if cfg else 1.0,
              sibling_probs=sib)
    if kw["uncond_logits"] is not None:
        kw["uncond_logits"] = kw["uncond_logits"].to(dtype)
    return layout, logits.to(dtype), tokens, q, kw


def _run_triton(layout, logits, tokens, q, *, uncond_logits=None, cfg_scale=1.0, temperature=1.0, top_k=None,
                top_p=None, min_p=None, rule="strict", sibling_probs=None, neighbours=None, gather_distortion=False,
                seed, offset, **rule_params):
    dev = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    checked = check_rule(rule, rule_params, dev(neighbours), logits.shape[-1], torch.device(DEVICE))
    settings = OpSettings(cfg_scale=cfg_scale, temperature=temperature, top_p=1.0 if top_p is None else top_p,
                        min_p=min_p or 0.0, top_k=top_k or 0, rule=checked.code, gather_distortion=gather_distortion,
                        branching=layout.branching, depth_limit=layout.depth_limit, rule_params=checked.params)
    out = verify_tree_triton(TreeArgs(
        target_logits=dev(logits), uncond_logits=dev(uncond_logits), node_tokens=dev(tokens), draft_probs=dev(q),
        sibling_probs=dev(sibling_probs), neighbours=checked.neighbours, children=layout.children, informed=None,
        seed=dev(seed), offset=dev(offset), settings=settings.floats(), choices=settings.ints()))
    return dict(zip(FIELDS, (t.cpu() for t in out)))


def _check(layout, logits, tokens, q, seed=torch.tensor([7]), offset=torch.tensor([3]), **kw):
    """Triton equals the reference field by field; returns the reference result."""
    expected = ref.verify_tree(logits, tokens, q, layout, seed=seed, offset=offset, **kw)
    got = _run_triton(layout, logits, tokens, q, seed=seed, offset=offset, **kw)
    for name in FIELDS:
        want, have = getattr(expected, name), got[name]
        assert have.shape == want.shape, name
        if want.is_floating_point():
            assert have.dtype == torch.float32, name
            torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, msg=name)
        else:
            assert have.dtype == (torch.int32 if name == "status" else torch.int64), name
            assert torch.equal(have, want.to(have.dtype)), (name, have, want)
    return expected


TREES = [(1, 3, 5, 7), (2, 2, 6, 7), (3, 2, 8, 64), (2, 3, 12, 64), (3, 3, 16, 1000), (4, 2, 9, 1000)]


TREE_RULES = [r for r in ref.RULES if r != "gsd"]  # gsd: its groups sort the node's row (cpu, cuda; an error here)


@pytest.mark.parametrize("rule", TREE_RULES)
@pytest.mark.parametrize("tree", TREES, ids=lambda t: "K{}D{}S{}V{}".format(*t))
def test_tree_equals_reference(tree, rule):
    layout, logits, tokens, q, kw = _case(*tree, seed=sum(tree))
    _check(layout, logits, tokens, q, rule=rule, **kw, **rule_inputs(rule, tree[3]))


OPTIONS = {  # (inputs, verify_tree keywords); the restrictions are slow in the interpreter: csd only, two rows
    "cfg": (dict(cfg=True), {}),
    "siblings": (dict(siblings=True), {}),
    "missing": (dict(missing=True), {}),
    "masked": (dict(masked=True), {}),
    "min_p": ({}, dict(min_p=0.05)),
    "greedy": (dict(cfg=True), dict(temperature=0.0)),
    "cold": ({}, dict(temperature=0.5)),
    "bf16": (dict(cfg=True, dtype=torch.bfloat16), {}),
}
RESTRICTED = {
    "top_k": ({}, dict(top_k=5)),
    "top_k_top_p_min_p": (dict(cfg=True), dict(top_k=20, top_p=0.8, min_p=0.01, temperature=0.7)),
}


@pytest.mark.parametrize("rule", TREE_RULES)
@pytest.mark.parametrize("option", list(OPTIONS))
def test_tree_options_equal_reference(option, rule):
    inputs, options = OPTIONS[option]
    layout, logits, tokens, q, kw = _case(2, 3, 12, 64, seed=len(option), spread=1.0, **inputs)
    _check(layout, logits, tokens, q, rule=rule, **kw, **options, **rule_inputs(rule, 64))


@pytest.mark.parametrize("option", list(RESTRICTED))
def test_tree_restrictions_equal_reference(option):
    inputs, options = RESTRICTED[option]
    layout, logits, tokens, q, kw = _case(3, 2, 8, 1000, batch=3, seed=len(option), spread=0.4, restrict=options,
                                          **inputs)
    _check(layout, logits, tokens, q, rule="csd", **kw, **options)


@pytest.mark.parametrize("rule", TREE_RULES)
def test_siblings_after_rejections_equal_reference(rule):
    """K = 4 over V = 7 with q far from p: main drafts are often rejected and up to three siblings tested in turn
    against the renormalised q without the earlier candidates (the RRS state that a stale q would get wrong); every
    rule on the main draft (lantern with its gathered distortion)."""
    layout, logits, tokens, q, kw = _case(4, 2, 7, 7, batch=24, seed=13, spread=2.0, siblings=True)
    if rule.startswith("lantern"):
        kw.update(neighbours=ref.codebook_neighbours(torch.randn(7, 2, generator=torch.Generator().manual_seed(2)), 3),
                  gather_distortion=True)
    result = _check(layout, logits, tokens, q, rule=rule, **kw)
    assert ((layout.rank[result.path.clamp(min=0)] >= 2) & (result.path >= 0)).any()  # a third candidate won


def test_gsd_trees_name_the_backends_that_run_them():
    layout, logits, tokens, q, kw = _case(2, 2, 6, 7, batch=2, seed=1)
    with pytest.raises(RuntimeError, match="cpu, cuda or torch"):
        _run_triton(layout, logits, tokens, q, rule="gsd", seed=torch.tensor([1]), offset=torch.tensor([0]), **kw)


def test_csd_relaxes_the_main_draft_only():
    """csd with a large λ and an open gate: the walks differ from strict and equal the reference (the relaxed test
    of the siblings, a planted bug, fails here)."""
    layout, logits, tokens, q, kw = _case(3, 3, 16, 64, batch=8, seed=3, spread=1.2, siblings=True)
    strict = _check(layout, logits, tokens, q, rule="strict", **kw)
    csd = _check(layout, logits, tokens, q, rule="csd", entropy_coef=0.3, tvd_threshold=1.0, **kw)
    assert not torch.equal(strict.tokens, csd.tokens)
    assert (csd.distortion > 0).any()


def test_per_row_seeds_and_offsets():
    layout, logits, tokens, q, kw = _case(2, 3, 12, 64, batch=3, seed=5)
    _check(layout, logits, tokens, q, seed=torch.tensor([4, 9, 2**40 + 3]), offset=torch.tensor([1, 2**33 + 5, 7]),
           **kw)


def test_large_vocabulary_in_chunks():
    """V = 16384: four chunks per sweep (the chunk carries of the CDF, the masses across chunks)."""
    layout, logits, tokens, q, kw = _case(2, 2, 6, 16384, batch=1, seed=11, spread=0.3, restrict=dict(top_k=50))
    _check(layout, logits, tokens, q, rule="csd", top_k=50, **kw)


def test_bad_logits_on_the_path_set_status_and_off_it_do_not():
    layout, logits, tokens, q, kw = _case(3, 2, 8, 64, batch=4, seed=2)
    first = ref.verify_tree(logits, tokens, q, layout, seed=torch.tensor([7]), offset=torch.tensor([3]))
    off_path = [next(s for s in range(8) if s not in first.path[b].tolist()) for b in range(4)]
    logits[0, 0, 5] = float("nan")  # the root is always on the path
    logits[1, 0, :] = float("-inf")  # no finite logit
    logits[2, off_path[2], 3] = float("inf")
    result = _check(layout, logits, tokens, q)
    assert result.status.tolist() == [ref.STATUS_BAD_LOGITS, ref.STATUS_BAD_LOGITS, 0, 0]
    assert torch.equal(result.tokens[2:], first.tokens[2:])


def test_cases_cover_every_branch_of_the_walk():
    """The random cases above are not vacuous: they include sibling acceptances, walks to a leaf and to the end of
    the main chain, rejections at the root, and missing candidates on the path."""
    accepted_sibling = full_chain = root_stop = leaf = False
    for tree in TREES:
        layout, logits, tokens, q, kw = _case(*tree, seed=sum(tree))
        r = ref.verify_tree(logits, tokens, q, layout, seed=torch.tensor([7]), offset=torch.tensor([3]), **kw)
        on_path = r.path.clamp(min=0)
        accepted_sibling |= bool(((layout.rank[on_path] > 0) & (r.path >= 0)).any())
        full_chain |= bool((r.accept_len == layout.levels).any())
        root_stop |= bool((r.accept_len == 0).any())
        stop = on_path.gather(1, r.accept_len[:, None])[:, 0]
        leaf |= bool(((layout.children[stop, 0] < 0) & (layout.depth[stop] < layout.levels)).any())
    assert accepted_sibling and full_chain and root_stop and leaf


def test_tree_kernel_compiles_for_sm90():
    """The restricted (top-k / top-p / min-p) and greedy strict variants; the default one is in report.py's table
    (tests/test_triton_compile.py)."""
    code = ("import json; from csd_kernels.backends.triton.report import compile_tree_kernel as c; "
            "print(json.dumps([vars(c(65536, top_k=True)), vars(c(1000, greedy=True, rule='strict', "
            "logits_dtype='float32'))]))")
    result = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="0"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [row["kernel"] for row in rows] == ["tree_kernel", "tree_kernel"]
    assert all(0 < row["registers"] <= 255 for row in rows)
