"""generate(..., static=True): the fixed-shape, sync-free iteration on a per-row static KV cache (CPU and meta; the
CUDA side runs in benchmarks/gpu_loop.py). Models: the shipped digits LM on a small grid, and the tiny Janus,
Lumina-mGPT (Chameleon) and LlamaGen fixtures; no downloads."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import JANUS_BOI, JANUS_BOS, LUMINA_KW, build_tiny_llama
from llamagen_tiny import GPT_CONFIGS, captions, seeded_state_dict
from torch.utils._python_dispatch import TorchDispatchMode

from csd_kernels.config.acceptance import rule_named
from csd_kernels.config.modes import MODE_TABLE
from csd_kernels.decoding import COUPLINGS, MODES, generate
from csd_kernels.decoding.static import StaticLoop, static_step
from csd_kernels.models import ImageGPT, JanusAdapter, LlamaGenAdapter, LuminaMGPT
from csd_kernels.models.llamagen.gpt import ModelArgs, Transformer
from csd_kernels.ops import verify as ops

pytestmark = pytest.mark.usefixtures("one_thread")

# every coupling for sjd and csd; the other modes at their default (their couplings run the same code as csd's)
SETTINGS = [(mode, coupling) for mode in MODES for coupling in (COUPLINGS if mode in ("sjd", "csd") else [None])]


def _llamagen(name: str) -> LlamaGenAdapter:
    model = Transformer(ModelArgs(**GPT_CONFIGS[name]))
    model.load_state_dict(seeded_state_dict({k: v.shape for k, v in model.state_dict().items()}))
    return LlamaGenAdapter(model.eval())


@pytest.fixture(scope="module")
def families(tiny_janus, tiny_chameleon):
    """name -> (adapter, prompt kwargs for one row, cfg_scale)."""
    from csd_kernels.zoo.digits import NULL_TOKEN_ID, NUM_CODES, load_codebook, load_lm, prompt_ids

    embeds, mask = captions()
    return {
        # the shipped digits LM on a 3 x 4 grid (few tokens; the loop does not care which grid the model was trained on)
        "digits": (ImageGPT(load_lm(), image_token_range=(0, NUM_CODES), grid=(3, 4), null_token_id=NULL_TOKEN_ID,
                            codebook=load_codebook().values), dict(input_ids=prompt_ids([7])), 1.5),
        "janus": (JanusAdapter(tiny_janus), dict(input_ids=torch.tensor([[JANUS_BOS, 5, 6, 7, JANUS_BOI]])), 3.0),
        "lumina": (LuminaMGPT(tiny_chameleon, **LUMINA_KW), dict(input_ids=torch.tensor([[1, 5, 6]])), 3.0),
        "llamagen_c2i": (_llamagen("c2i"), dict(input_ids=torch.tensor([[3]])), 4.0),
        "llamagen_t2i": (_llamagen("t2i"), dict(prompt_embeds=embeds[:1], attention_mask=mask[:1]), 4.0),
    }


def _same(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert a.forward_passes == b.forward_passes and a.accepted == b.accepted
    for name in ("entropy_map", "accept_map", "distortion_map", "tvd_map"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=1e-4, rtol=1e-4, equal_nan=True)


# ----------------------------------------------------------------------------------------------------------------------
# the same tokens and passes as the per-row loop
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["digits", "janus", "lumina", "llamagen_c2i", "llamagen_t2i"])
@pytest.mark.parametrize("mode, coupling", SETTINGS)
def test_static_equals_per_row_loop_at_batch_one(families, family, mode, coupling):
    adapter, prompt, cfg = families[family]
    if family.startswith("llamagen") and rule_named(MODE_TABLE[mode].rule or "strict").needs_neighbours:
        pytest.skip("this LlamaGen has no VQ, so no codebook for the neighbour table (lantern runs on the others)")
    for temperature in (1.0, 0.0):
        kw = dict(mode=mode, coupling=coupling, window=5, cfg_scale=cfg, temperature=temperature, seed=11)
        _same(generate(adapter, **prompt, **kw), generate(adapter, **prompt, static=True, **kw))


def test_surplus_iterations_change_nothing(families, monkeypatch):
    """With the done flag read 3 iterations late, the extra iterations leave tokens, maps and counts as they were."""
    import csd_kernels.decoding.static as static_module

    adapter, prompt, cfg = families["janus"]
    kw = dict(mode="csd", window=5, cfg_scale=cfg, seed=4)
    eager = generate(adapter, **prompt, **kw)
    monkeypatch.setattr(static_module, "CPU_LAG", 3)
    _same(eager, generate(adapter, **prompt, static=True, **kw))


@pytest.mark.parametrize("family", ["digits", "janus", "lumina", "llamagen_c2i", "llamagen_t2i"])
@pytest.mark.parametrize("draft_init", ["above", "above-p"])
def test_static_equals_per_row_loop_with_drafts_from_above(families, family, draft_init):
    """Windows of 6 reach the next grid row on every family (Lumina-mGPT: the grid's columns, not its row ends)."""
    adapter, prompt, cfg = families[family]
    for mode in ("sjd", "csd"):
        kw = dict(mode=mode, window=6, cfg_scale=cfg, seed=2, draft_init=draft_init)
        _same(generate(adapter, **prompt, **kw), generate(adapter, **prompt, static=True, **kw))


def _padded_rows(rows: list, pad: int) -> tuple:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@pytest.mark.parametrize("family", ["janus", "lumina", "llamagen_t2i"])
def test_batched_static_rows_equal_rows_alone(families, family):
    adapter, _, cfg = families[family]
    if family == "llamagen_t2i":
        embeds, mask = captions()  # two rows with different caption padding
        rows = [dict(prompt_embeds=embeds[i:i + 1], attention_mask=mask[i:i + 1]) for i in range(2)]
        batch = dict(prompt_embeds=embeds, attention_mask=mask)
    else:
        texts = [[JANUS_BOS, 5, 6, 7, JANUS_BOI], [JANUS_BOS, 9, JANUS_BOI], [JANUS_BOS, 3, 3, 2, 8, 1, JANUS_BOI]]
        texts = texts if family == "janus" else [[1, 5, 6], [1, 7, 9, 4, 4], [2]]
        ids, mask = _padded_rows(texts, 0)
        rows = [dict(input_ids=torch.tensor([t])) for t in texts]
        batch = dict(input_ids=ids, attention_mask=mask)
    seeds = [5, 9, 2][: len(rows)]
    kw = dict(mode="csd", window=4, cfg_scale=cfg, static=True)
    together = generate(adapter, **batch, seed=seeds, **kw)
    for row, (prompt, seed) in enumerate(zip(rows, seeds)):
        alone = generate(adapter, **prompt, seed=seed, **kw)
        assert torch.equal(together.tokens[row], alone.tokens[0])
        assert together.passes_per_row()[row] == alone.forward_passes
    assert together.forward_passes == max(together.passes_per_row())


# ----------------------------------------------------------------------------------------------------------------------
# no host reads inside the iterations, the same shapes every iteration (meta device: a stand-in for CUDA)
# ----------------------------------------------------------------------------------------------------------------------
class _HostReads(TorchDispatchMode):
    """Logs every host read of a non-CPU tensor (scalar reads, nonzero, copies to the CPU) and, per op, the shapes of
    its tensor arguments. A meta -> CPU copy is logged and skipped (the CPU side keeps its value)."""

    READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.item.default",
             "aten.is_nonzero.default", "aten.equal.default"}

    def __init__(self):
        super().__init__()
        self.reads, self.ops = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        self.ops.append((name, tuple((tuple(t.shape), t.dtype) for t in tensors)))
        off_cpu = any(t.device.type != "cpu" for t in tensors)
        if name in self.READS and off_cpu:
            self.reads.append(name)
            if name == "aten._local_scalar_dense.default":
                return 1  # on meta: "the check passes"
        if name in ("aten.copy_.default", "aten._to_copy.default") and off_cpu:
            target = args[0] if name == "aten.copy_.default" else None
            to_cpu = (target is not None and target.device.type == "cpu") or kwargs.get("device") == torch.device("cpu")
            if to_cpu:
                self.reads.append("copy to cpu" + (" (non_blocking)" if kwargs.get("non_blocking") or
                                                   (len(args) > 2 and args[2]) else ""))
                return target if target is not None else torch.zeros(args[0].shape, dtype=args[0].dtype)
        return func(*args, **kwargs)


class _Stop(Exception):
    pass


def _on_meta(family: str, families):
    adapter, prompt, cfg = families[family]
    adapter = copy.deepcopy(adapter)
    for name in ("model", "lm"):
        if isinstance(getattr(adapter, name, None), torch.nn.Module):
            getattr(adapter, name).to("meta")
    prompt = {k: v.to("meta") for k, v in prompt.items() if k != "attention_mask"}
    return adapter, prompt, cfg


@pytest.mark.parametrize("family", ["digits", "janus", "lumina", "llamagen_c2i"])
@pytest.mark.parametrize("mode, coupling", [("csd", "maximal"), ("sjd", "gumbel"), ("jd", None), ("ar", None),
                                            ("gsd", None)])
def test_no_host_read_inside_the_iterations(families, family, mode, coupling, monkeypatch):
    # verify's fake implementation stands in for the kernels on the meta device
    monkeypatch.setitem(ops._BACKEND_FUNCTIONS, "torch", ops.fake_backend)
    adapter, prompt, cfg = _on_meta(family, families)
    logs = []

    def run(loop, bar=None):
        for _ in range(3):
            with _HostReads() as iteration:
                loop._step()
            with _HostReads() as lagged:
                loop._push()
                loop.lagged_flags()
            logs.append((iteration, lagged))
        raise _Stop

    monkeypatch.setattr(StaticLoop, "run", run)
    with pytest.raises(_Stop), _HostReads():  # outside the iterations (prefill) a read on meta gives 1
        generate(adapter, **prompt, mode=mode, coupling=coupling, window=5, cfg_scale=cfg, static=True)
    assert [len(it.reads) for it, _ in logs] == [0, 0, 0], logs[0][0].reads
    assert [lag.reads for _, lag in logs] == [["copy to cpu (non_blocking)"]] * 3
    shapes = [it.ops for it, _ in logs]
    assert shapes[0] and shapes[1] == shapes[0] and shapes[2] == shapes[0]  # the first iteration (at x_{-1}) too


def test_padded_prompts_need_no_host_read_in_either_loop(families):
    """ar with left-padded (and CFG) rows: the adapter passes its own 4-D mask, transformers' mask code never reads
    the padding on the host."""
    adapter, _, cfg = families["janus"]
    ids, mask = _padded_rows([[JANUS_BOS, 5, 6, 7, JANUS_BOI], [JANUS_BOS, 9, JANUS_BOI]], 0)
    for static in (False, True):
        if static:
            adapter.static_cache(1)
        adapter.prefill(ids, mask, True)
        tokens = torch.zeros(2, 1, dtype=torch.int64)
        with _HostReads() as log:
            if static:
                adapter.forward_static(tokens, torch.tensor([-1, -1]))
            else:
                adapter.forward(tokens, -1)
        cpu_reads = [name for name, _ in log.ops if name in _HostReads.READS]
        assert cpu_reads == [], (static, cpu_reads)


# ----------------------------------------------------------------------------------------------------------------------
# one iteration compiles without a graph break
# ----------------------------------------------------------------------------------------------------------------------
def test_one_iteration_compiles_fullgraph(monkeypatch):
    """torch.compile(fullgraph=True) of static_step raises on any graph break; the compiled iteration (dynamo's
    trace run by aot_eager: the same graph inductor gets, without its slow code generation) equals the eager one."""
    lm = build_tiny_llama(24, seed=0, init=0.5)
    adapter = ImageGPT(lm, image_token_range=(0, 16), grid=(2, 3), null_token_id=23)
    states = []

    def run(loop, bar=None):
        eager_state = copy.deepcopy(loop.state)
        static_step(loop.adapter, loop.settings, eager_state)
        compiled = torch.compile(static_step, fullgraph=True, backend="aot_eager")
        compiled(loop.adapter, loop.settings, loop.state)
        states.append((eager_state, loop.state))
        raise _Stop

    monkeypatch.setattr(StaticLoop, "run", run)
    with pytest.raises(_Stop):
        generate(adapter, torch.tensor([[16]]), mode="csd", window=4, cfg_scale=2.0, seed=3, static=True)
    eager, compiled = states[0]
    for name in ("seq", "n", "drafted", "attempts", "accepted", "passes", "q_store"):
        torch.testing.assert_close(getattr(compiled, name), getattr(eager, name))
    assert int(eager.n[0]) >= 1


# ----------------------------------------------------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------------------------------------------------
def test_static_option_errors(families):
    adapter, prompt, cfg = families["digits"]
    with pytest.raises(ValueError, match="cuda_graph=True needs a model on a CUDA device"):
        generate(adapter, **prompt, static=True, cuda_graph=True)
    with pytest.raises(ValueError, match="apply to static=True only"):
        generate(adapter, **prompt, compile=True)
    with pytest.raises(ValueError, match="max_lead applies to static=False"):
        generate(adapter, **prompt, static=True, max_lead=3)

    class Eager:  # the eager protocol only
        grid, vocab_size = (1, 2), 4

        def prefill(self, *a): ...
        def forward(self, *a): ...
        def crop(self, *a): ...
        def image_sequence(self, *a): ...
        def decode(self, *a): ...

    with pytest.raises(ValueError, match="static=True needs an adapter with static_cache"):
        generate(Eager(), **prompt, static=True)


# ----------------------------------------------------------------------------------------------------------------------
# Triton launches under the tensors' device guard
# ----------------------------------------------------------------------------------------------------------------------
def test_triton_launches_under_the_tensors_device_guard(monkeypatch):
    """Triton launches on the current CUDA device: both launch sites enter device_guard(tensors' device) first (run
    here by Triton's interpreter on CPU tensors, with the guard recorded)."""
    import contextlib

    from csd_kernels.backends.triton import drafts
    from csd_kernels.backends.triton import verify as triton_verify

    entered = []

    @contextlib.contextmanager
    def recording_guard(device):
        entered.append(torch.device(device))
        yield

    monkeypatch.setattr(triton_verify, "device_guard", recording_guard)
    monkeypatch.setattr(drafts, "device_guard", recording_guard)
    seed, offset, positions = torch.tensor([1]), torch.tensor([0]), torch.tensor([0, 3])
    drafts.draft_tokens(seed, offset, positions, 4, 16)
    logits = torch.randn(2, 3, 16)
    ops.verify(logits, torch.full((2, 3), -1), backend="triton")
    assert entered == [torch.device("cpu")] * 2


# ----------------------------------------------------------------------------------------------------------------------
# draft trees (tests/test_tree.py holds the law; here: every family's forward_tree / keep_path)
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["digits", "janus", "lumina", "llamagen_c2i", "llamagen_t2i"])
def test_greedy_tree_equals_ar_in_every_family(families, family):
    adapter, prompt, cfg = families[family]
    ar = generate(adapter, **prompt, mode="ar", cfg_scale=cfg, temperature=0)
    out = generate(adapter, **prompt, mode="sjd", window=8, cfg_scale=cfg, temperature=0, static=True, tree=(3, 2))
    assert torch.equal(out.tokens, ar.tokens)


@pytest.mark.parametrize("tree, window", [((2, 2), 4), ((2, 3), 8), ((4, 2), 16)])
def test_lumina_greedy_tree_equals_ar_batched(families, tree, window):
    """Rows of different prompt lengths (padding, CFG) commit at different speeds, so their windows start at
    different places within a grid row: every pattern of forced row ends among the tree's levels."""
    adapter, _, cfg = families["lumina"]
    prompt = dict(input_ids=torch.tensor([[1, 5, 6], [0, 0, 9], [0, 3, 7]]),
                  attention_mask=torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]]))
    ar = generate(adapter, **prompt, mode="ar", cfg_scale=cfg, temperature=0)
    out = generate(adapter, **prompt, mode="sjd", window=window, cfg_scale=cfg, temperature=0, static=True,
                   tree=tree)
    assert torch.equal(out.tokens, ar.tokens)


def test_lumina_tree_logits_equal_each_paths_chain(families):
    """forward_tree: every node's logits equal the chain forward (forward_static) of its root-to-node path, with
    the window starting at each place in a grid row (first = -1 .. 3 on a 4-wide grid) and CFG rows. The main chain
    reaches depth 7: its paths hold two row ends (a row end's input sees the one above it)."""
    from csd_kernels import reference as ref

    adapter, prompt, cfg = families["lumina"]
    window = 12
    layout = ref.tree_layout(2, 3, window)
    first = torch.tensor([-1, 0, 1, 2, 3])
    adapter.static_cache(window, tree=layout)
    adapter.prefill(prompt["input_ids"].expand(len(first), -1), None, cfg=True)
    tokens = torch.randint(0, adapter.vocab_size, (len(first), window), generator=torch.Generator().manual_seed(0))
    cond, uncond = adapter.forward_tree(tokens, first, layout.depth, layout.ancestor)
    for node in range(1, window):
        path = [s for s in range(window) if layout.ancestor[node, s]]  # the root .. node, by depth
        chain = torch.cat([tokens[:, path], tokens[:, : window - len(path)]], 1)
        chain_cond, chain_uncond = adapter.forward_static(chain, first)
        torch.testing.assert_close(cond[:, node], chain_cond[:, len(path) - 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(uncond[:, node], chain_uncond[:, len(path) - 1], atol=1e-5, rtol=1e-5)
    adapter.static_cache(window)  # no tree announced: no room for its row ends
    adapter.prefill(prompt["input_ids"], None, cfg=False)
    with pytest.raises(ValueError, match="static_cache"):
        adapter.forward_tree(tokens[:1], first[:1], layout.depth, layout.ancestor)


@pytest.mark.parametrize("family", ["digits", "janus", "lumina", "llamagen_c2i"])
def test_no_host_read_inside_tree_iterations(families, family, monkeypatch):
    """The tree iteration (forward_tree, the reference walk, keep_path, commit) reads nothing on the host."""
    adapter, prompt, cfg = _on_meta(family, families)
    logs = []

    def run(loop, bar=None):
        for _ in range(3):
            with _HostReads() as iteration:
                loop._step()
            logs.append(iteration)
        raise _Stop

    monkeypatch.setattr(StaticLoop, "run", run)
    with pytest.raises(_Stop), _HostReads():
        generate(adapter, **prompt, mode="sjd", window=8, cfg_scale=cfg, static=True, tree=(3, 2))
    assert [len(it.reads) for it in logs] == [0, 0, 0], logs[0].reads
    assert logs[1].ops == logs[0].ops and logs[2].ops == logs[0].ops


def test_one_tree_iteration_compiles_fullgraph(monkeypatch):
    """tree_step under torch.compile(fullgraph=True) (aot_eager) equals the eager iteration (keys and values moved
    on a copy of the adapter for the eager one)."""
    from csd_kernels.decoding.tree import tree_step

    lm = build_tiny_llama(24, seed=0, init=0.5)
    adapter = ImageGPT(lm, image_token_range=(0, 16), grid=(2, 3), null_token_id=23)
    states = []

    def run(loop, bar=None):
        from csd_kernels import reference as ref

        tree = ref.tree_layout(*loop.settings.tree, loop.settings.window)
        eager_state = copy.deepcopy(loop.state)
        eager_adapter = copy.deepcopy(loop.adapter)
        tree_step(eager_adapter, loop.settings, eager_state, tree)
        compiled = torch.compile(tree_step, fullgraph=True, backend="aot_eager")
        compiled(loop.adapter, loop.settings, loop.state, tree)
        states.append((eager_state, loop.state))
        raise _Stop

    monkeypatch.setattr(StaticLoop, "run", run)
    with pytest.raises(_Stop):
        generate(adapter, torch.tensor([[16]]), mode="sjd", window=6, cfg_scale=2.0, seed=3, static=True, tree=(2, 2))
    eager, compiled = states[0]
    for name in ("seq", "n", "drafted", "attempts", "accepted", "passes", "q_store"):
        torch.testing.assert_close(getattr(compiled, name), getattr(eager, name))


# ----------------------------------------------------------------------------------------------------------------------
# benchmarks/static_loop_cpu.py's meta-device part (a meta prompt has no values to check)
# ----------------------------------------------------------------------------------------------------------------------
def test_meta_host_time_benchmark_runs(monkeypatch):
    """The Janus-Pro-7B-shaped model on the meta device, cut to 2 layers: both loops run their timed iterations.
    generate read the meta prompt's ids on the host to check them against the vocabulary, and failed; csd: the fake
    verify took its last argument for return_probs and returned no probs."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import static_loop_cpu

    backends = dict(ops._BACKEND_FUNCTIONS)
    results = static_loop_cpu.meta_host_time([1], ["csd"], iterations=1, layers=2)
    assert ops._BACKEND_FUNCTIONS == backends  # verify's fake implementation is taken out again
    row = results["B1/csd"]
    assert row["static_ms_per_iteration"] > 0 and row["eager_ms_per_iteration"] > 0
    assert row["static_ops_per_iteration"] > 0 and row["eager_ops_per_iteration"] > 0


def test_meta_prompts_skip_the_value_checks():
    from csd_kernels.decoding.validation import ArgumentError, check_prompt, check_prompt_ids

    ids, mask = torch.zeros(2, 3, dtype=torch.long, device="meta"), torch.ones(2, 3, device="meta")
    assert check_prompt(ids, None, mask) == 2
    check_prompt_ids(ids, 10)
    with pytest.raises(ArgumentError, match="input_ids"):  # on the CPU the same check still refuses
        check_prompt_ids(torch.tensor([[10]]), 10)
