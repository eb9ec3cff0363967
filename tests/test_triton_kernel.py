"""The Triton backend against the reference maths (reference.verify in float32).

On CPU this runs through Triton's interpreter, which has to be switched on before triton is imported.  Shapes are
kept small: the interpreter executes every block op in numpy.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from csd_kernels import reference as ref  # noqa: E402
from csd_kernels import testing  # noqa: E402
from csd_kernels.backends.triton import verify as tv  # noqa: E402
from csd_kernels.backends.triton.kernels import common  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton on CPU needs TRITON_INTERPRET=1 before triton is imported", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(0) / inf·0 inside the interpreter

MASK32 = 0xFFFFFFFF


@triton.jit
def _runtime_bound_kernel(out_ptr, n, BLOCK: tl.constexpr):
    total = tl.zeros((), tl.int32)
    for start in range(0, n, BLOCK):
        total += tl.sum(tl.where(start + tl.arange(0, BLOCK) < n, 1, 0), 0)
    tl.store(out_ptr, total)


def test_loops_with_a_runtime_bound():
    """``for v0 in range(0, V, BLOCK_V)`` with V a kernel argument (the chunked and tree kernels' vocabulary loops):
    Triton 3.6's interpreter with numpy >= 2.4 failed on it (int() of a shape-[1] array) until
    backends.triton.interpreter_compat squeezed the scalar."""
    out = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _runtime_bound_kernel[(1,)](out, 37, BLOCK=16)
    assert out.item() == 37


# ----------------------------------------------------------------------------------------------------------------------
# Philox streams, bit for bit
# ----------------------------------------------------------------------------------------------------------------------
@triton.jit
def _philox_kernel(c_ptr, k_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    c0 = tl.load(c_ptr + 4 * offs + 0, mask=mask, other=0).to(tl.uint32)
    c1 = tl.load(c_ptr + 4 * offs + 1, mask=mask, other=0).to(tl.uint32)
    c2 = tl.load(c_ptr + 4 * offs + 2, mask=mask, other=0).to(tl.uint32)
    c3 = tl.load(c_ptr + 4 * offs + 3, mask=mask, other=0).to(tl.uint32)
    k0 = tl.load(k_ptr + 2 * offs + 0, mask=mask, other=0).to(tl.uint32)
    k1 = tl.load(k_ptr + 2 * offs + 1, mask=mask, other=0).to(tl.uint32)
    w0, w1, w2, w3 = common.philox(c0, c1, c2, c3, k0, k1)
    tl.store(out_ptr + 4 * offs + 0, w0.to(tl.int64), mask=mask)
    tl.store(out_ptr + 4 * offs + 1, w1.to(tl.int64), mask=mask)
    tl.store(out_ptr + 4 * offs + 2, w2.to(tl.int64), mask=mask)
    tl.store(out_ptr + 4 * offs + 3, w3.to(tl.int64), mask=mask)


@triton.jit
def _streams_kernel(seed_ptr, seed_stride, positions_ptr, offset_ptr, offset_stride, ua_ptr, us_ptr, g_ptr, L, V,
                    PER_ROW_SEED: tl.constexpr, BLOCK_V: tl.constexpr):
    """The same helpers the verification kernels call, writing the uniforms out."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // L
    i = pid % L
    pos, row_id, k0, k1, u_acc, u_smp = common.position_rng(seed_ptr, seed_stride, positions_ptr, 1,
                                                            offset_ptr + b * offset_stride, b, i,
                                                         PER_ROW_SEED)
    tl.store(ua_ptr + pid, u_acc)
    tl.store(us_ptr + pid, u_smp)
    for v0 in range(0, V, BLOCK_V):  # chunked, as the large-V kernel draws them
        offs = v0 + tl.arange(0, BLOCK_V)
        g = common.gumbel_uniforms(v0, pos, row_id, k0, k1, BLOCK_V)
        tl.store(g_ptr + pid * V + offs, g, mask=offs < V)


def test_philox_words_bit_identical():
    gen = torch.Generator().manual_seed(1)
    n = 200
    counters = torch.randint(0, 2**32, (n, 4), generator=gen, dtype=torch.int64)
    keys = torch.randint(0, 2**32, (n, 2), generator=gen, dtype=torch.int64)
    counters[:4] = torch.tensor([[0, 0, 0, 0], [MASK32] * 4, [MASK32, 0, MASK32, 0x80000000], [1, 2, 3, 4]])
    keys[:4] = torch.tensor([[0, 0], [MASK32, MASK32], [0x9E3779B9, 0xBB67AE85], [MASK32, 0]])
    out = torch.empty((n, 4), dtype=torch.int64)
    _philox_kernel[(1,)](counters.to(DEVICE), keys.to(DEVICE), out_d := out.to(DEVICE), n, BLOCK=256)
    expected = torch.stack(ref.philox4x32(*counters.unbind(-1), *keys.unbind(-1)), -1)
    assert torch.equal(out_d.cpu(), expected)
    # the published known-answer vector of Philox4x32-10 (Random123 kat_vectors)
    kat = ref.philox4x32(*(torch.tensor([MASK32]) for _ in range(4)), torch.tensor([MASK32]), torch.tensor([MASK32]))
    assert [int(w) for w in kat] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


@pytest.mark.parametrize(
    "seed, offset, positions, length, vocab",
    [
        ([7], 0, [0, 5, 11], 4, 13),
        ([2**32 + 3], 2**40 + 17, [2**32 - 2, 2**32 - 1, 0], 5, 9),  # seed >= 2^32, large offset, pos wrap
        # per-row seeds, seeds >= 2^63 as int64
        ([1, 2**33 + 5, 2**63 - 1, -1, -2**63], 2**63 - 1, [2**32 - 3, 123456789, 2**40 + 2, 7, 9], 5, 10),
        ([0], 12345678901, [3], 1, 1),
        ([1, 2, 3], [0, 2**40 + 17, 5], [4, 0, 2**32 - 1], 5, 9),  # per-row offsets
        ([9], [2**63 - 1, 0, 2**32], [0, 1, 2], 3, 4),  # per-row offsets with a shared seed
    ],
)
def test_stream_uniforms_bit_identical(seed, offset, positions, length, vocab):
    seed = torch.tensor(seed, dtype=torch.int64)
    offset = torch.tensor(offset if isinstance(offset, list) else [offset], dtype=torch.int64)
    positions = torch.tensor(positions, dtype=torch.int64)
    batch = positions.numel()
    ua = torch.empty((batch, length), dtype=torch.float32, device=DEVICE)
    us = torch.empty_like(ua)
    g = torch.empty((batch, length, vocab), dtype=torch.float32, device=DEVICE)
    per_row = seed.numel() != 1
    _streams_kernel[(batch * length,)](seed.to(DEVICE), 1 if per_row else 0, positions.to(DEVICE), offset.to(DEVICE),
                                       1 if offset.numel() != 1 else 0, ua, us, g, length, vocab, PER_ROW_SEED=per_row,
                                       BLOCK_V=8)
    ea, es = ref.step_uniforms(seed, offset, positions, length)
    eg = ref.gumbel_uniforms(seed, positions, length, vocab)
    bits = lambda t: t.cpu().view(torch.int32)  # noqa: E731
    assert torch.equal(bits(ua), bits(ea))
    assert torch.equal(bits(us), bits(es))
    assert torch.equal(bits(g), bits(eg))


# ----------------------------------------------------------------------------------------------------------------------
# The whole op against reference.verify
# ----------------------------------------------------------------------------------------------------------------------
def make_case(B, L, V, *, dtype=torch.float32, uncond=True, q="dense", start=0, seed_rows=False, strided=False,
              int_logits=False, gen_seed=0, bad_tokens=False):
    return testing.make_case(B, L, V, dtype=dtype, cfg=uncond, q=q, start=start, seed_rows=seed_rows, strided=strided,
                             int_logits=int_logits, bad_tokens=bad_tokens, scale=3.0, seed=gen_seed)


PATHS = ["split", "register", "chunked"]


def forced_plan(path, V):
    """A plan for ``path`` that gives several programs' worth of slices / chunks even at small V."""
    if path == "register":
        block = max(16, triton.next_power_of_2(V))
        return tv.Plan("register", block, tv.register_num_warps(block))
    block = triton.next_power_of_2(max(1, V // 3) + 1) // 2  # three to four blocks per row
    if path == "chunked":
        return tv.Plan("chunked", max(16, block), 4)
    return tv.Plan("split", max(4, block), 4)


def run_both(case, *, cfg_scale=1.7, temperature=0.9, top_k=0, rule="csd", coupling=0, return_probs=True, path=None,
             words=None, neighbours=None, gather_distortion=False, informed=None, **rule_params):
    """(verify_triton's result, reference.verify's result) as VerifyResults. ``words``: (seed, offset) as ints for
    verify_triton in place of the case's tensors (what an eager call with ints hands it). Rule parameters: the
    table's defaults but csd's λ 0.4 (rule_params: by name)."""
    dev = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    rule_params = {"entropy_coef": 0.4, **rule_params}
    options = dict(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k or None, rule=rule,
                   coupling=ref.COUPLINGS[coupling], return_probs=return_probs, gather_distortion=gather_distortion,
                   **rule_params)
    nb = None if neighbours is None else neighbours.to(DEVICE)
    args = testing.backend_args(dev, neighbours=nb, words=words, informed=None if informed is None else informed.to(
        DEVICE), **options)
    if path is None:
        got = tv.verify_triton(args)
    else:
        plan = forced_plan(path, case["target_logits"].shape[-1])
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tv, "plan", lambda *a, **k: plan)
            got = tv.verify_triton(args)
    got = ref.VerifyResult(*[t.cpu() for t in got])
    got.probs = got.probs if return_probs else None
    expected = testing.reference_result(case, neighbours=neighbours, informed=informed, **options)
    return got, expected


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed, offset", [(5, 3), (2**64 - 2**40 - 7, 2**40 + 5)])  # int32-sized, int64 words (a
# negative one: what an int64 seed tensor may hold; ck.verify takes int seeds in [0, 2^63))
def test_int_seed_and_offset_words_match_reference(path, seed, offset):
    """Int seeds / offsets reach the kernels as arguments (SEED_VALUE / OFFSET_VALUE), not tensors: the same streams,
    also for a seed >= 2^63 (a negative int64 word) and an offset past int32."""
    case = make_case(2, 4, 300, q="dense", gen_seed=5)
    word = seed - 2**64 if seed >= 2**63 else seed  # the int64 bit pattern
    case["seed"], case["offset"] = torch.tensor([word]), torch.tensor([offset])  # for the reference
    for coupling in (0, 2):  # gumbel reads the seed in the split path's first kernel too
        got, expected = run_both(case, coupling=coupling, path=path, words=(word, offset))
        check(got, expected, 300)


def check(got, expected, V, return_probs=True):
    """Dtypes and shapes, then testing.compare: integer outputs exactly, statistics within 1e-4."""
    B, L = got.tokens.shape
    assert got.accept_len.dtype == torch.int32 and got.accept_len.shape == (B,)
    assert got.tokens.dtype == torch.int64 and got.status.dtype == torch.int32
    for name in ("entropy", "tvd", "accept_prob", "distortion"):
        assert getattr(got, name).dtype == torch.float32 and getattr(got, name).shape == (B, L), name
    if return_probs:
        assert got.probs.shape == (B, L, V) and got.probs.dtype == torch.float32
    testing.compare(got, expected)


CASES = [
    # (B, L, V, case kwargs, op kwargs)
    (1, 1, 1, {}, {}),
    (1, 1, 1, dict(q=None), dict(temperature=0.0)),
    (3, 5, 7, {}, {}),
    (3, 5, 7, dict(q=None), {}),
    (3, 5, 7, dict(q="uniform", uncond=False), dict(coupling=1)),
    (3, 5, 7, dict(q="sparse"), dict(coupling=1)),
    (3, 5, 7, dict(dtype=torch.bfloat16), dict(coupling=2)),
    (3, 5, 7, dict(dtype=torch.float16, q=None), dict(coupling=2, top_k=3)),
    (3, 5, 7, dict(int_logits=True), dict(top_k=2, temperature=1.0)),  # top-k ties kept, ±0
    (3, 5, 7, dict(int_logits=True, q=None), dict(temperature=0.0, coupling=2)),  # greedy ties: lowest index
    (3, 5, 7, dict(start=2, q=None), dict(rule="strict")),
    (3, 5, 7, dict(start=5), dict(rule="strict", coupling=2)),
    (3, 5, 7, dict(seed_rows=True, strided=True), dict(coupling=2)),
    (3, 5, 7, dict(bad_tokens=True, start=1, q=None), {}),
    (1, 5, 1000, {}, dict(return_probs=False)),
    (3, 5, 1000, dict(dtype=torch.bfloat16, strided=True), dict(top_k=50, coupling=2)),
    (3, 1, 1000, dict(q=None, uncond=False), dict(temperature=0.0, coupling=1)),
    (3, 5, 1000, dict(q="uniform", dtype=torch.float16), dict(entropy_coef=2.0, tvd_threshold=1.0)),
    (1, 5, 1000, dict(q="sparse", start=2, seed_rows=True), dict(coupling=1, top_k=10)),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("B, L, V, case_kw, op_kw", CASES)
def test_matches_reference(B, L, V, case_kw, op_kw, path):
    if path == "split" and op_kw.get("top_k", 0) and op_kw.get("temperature", 1.0) > 0:
        pytest.skip("top-k runs on the per-position paths (plan never splits it)")
    case = make_case(B, L, V, **case_kw)
    got, expected = run_both(case, path=path, **op_kw)
    check(got, expected, V, op_kw.get("return_probs", True))


def test_plan():
    """Everything splits into SPLIT_BLOCK slices (at most SPLIT_MAX_SLICES), except top-k, which needs whole rows."""
    for positions in (1, 16, 256, 4096):
        assert tv.plan(positions, 16384, False, 132) == tv.Plan("split", tv.SPLIT_BLOCK, 4)
    assert tv.plan(16, 7, False, 132) == tv.Plan("split", 16, 4)
    assert tv.plan(16, 1 << 20, False, 132).block == (1 << 20) // tv.SPLIT_MAX_SLICES
    assert tv.plan(16, 16384, True, 132) == tv.Plan("register", 16384, 16)
    assert tv.plan(16, 100_000, True, 132).path == "chunked"


def test_large_vocab_in_registers():
    V = 16384
    assert triton.next_power_of_2(V) <= tv.REGISTER_MAX_BLOCK
    case = make_case(1, 2, V, dtype=torch.bfloat16, q="dense")
    got, expected = run_both(case, coupling=2, top_k=100)
    check(got, expected, V)


@pytest.mark.parametrize("path", PATHS)
def test_bad_inputs_flagged(path):
    V = 7
    case = make_case(3, 5, V, q="dense", start=2)
    c, u, q = case["target_logits"].clone(), case["uncond_logits"].clone(), case["draft_probs"].clone()
    tokens = case["draft_tokens"].clamp(0, V - 1)  # only the planted bad tokens below
    c[0, 1, 3] = float("nan")
    u[1, 3, 0] = float("inf")
    c[2, 4, 6] = 3e38  # finite inputs whose CFG mix overflows
    u[2, 4, 6] = -3e38
    q[1, 0, 2] = -0.1  # a negative draft probability
    q[2, 2, 5] = float("nan")
    tokens[0, 0] = -1  # missing committed token
    tokens[1, 2] = V + 4  # out of range
    tokens[2, 1] = -3
    case.update(target_logits=c, uncond_logits=u, draft_probs=q, draft_tokens=tokens)
    for coupling in (0, 2):
        got, expected = run_both(case, coupling=coupling, path=path)
        check(got, expected, V)
        assert got.status.tolist() == [1 | 8, 1 | 2 | 4, 1 | 2 | 4 | 8]  # row 2: a bad token at a committed position


def test_int32_draft_tokens_and_strided_tokens():
    case = make_case(3, 5, 7, q=None, start=1)
    tokens = case["draft_tokens"].to(torch.int32)
    case["draft_tokens"] = torch.stack([tokens, tokens], -1)[..., 0]
    assert case["draft_tokens"].stride(1) == 2
    got, expected = run_both(case)
    check(got, expected, 7)


def test_random_rows_many():
    """Many random rows with acceptance near the decision boundary; decisions and tokens must agree."""
    B, L, V = 20, 4, 33
    case = make_case(B, L, V, q="dense", gen_seed=3, uncond=False)
    # drafts sampled from q, the typical speculative-decoding input
    q = case["draft_probs"]
    g = torch.Generator().manual_seed(4)
    case["draft_tokens"] = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, L)
    mism = 0
    for coupling in (0, 1, 2):
        got, expected = run_both(case, coupling=coupling, cfg_scale=1.0, temperature=1.3)
        mism += int((got.tokens != expected.tokens).sum())
        assert torch.equal(got.accept_len, expected.accept_len)
        torch.testing.assert_close(got.accept_prob, expected.accept_prob, rtol=1e-4, atol=1e-5)
    assert mism <= max(1, int(0.001 * 3 * B * L))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "B, L, V, case_kw, op_kw",
    [
        (2, 3, 100, {}, {}),
        (2, 3, 100, dict(q=None, dtype=torch.bfloat16), dict(coupling=2)),
        (2, 3, 100, dict(q="sparse", strided=True), dict(coupling=1)),
        (2, 3, 100, dict(q="uniform"), dict(temperature=0.0, coupling=2)),
        (2, 2, 70, dict(int_logits=True, q=None), dict(temperature=0.0)),
        (2, 3, 100, dict(int_logits=True, seed_rows=True), dict(coupling=2)),  # gumbel ties across slices
        (2, 3, 100, dict(start=2), dict(rule="strict", return_probs=False)),
    ],
)
def test_many_blocks_per_row(B, L, V, case_kw, op_kw, path):
    """Rows spanning several slices (split) or chunks (chunked): carries, slice search, cross-slice argmax."""
    case = make_case(B, L, V, **case_kw)
    got, expected = run_both(case, path=path, **op_kw)
    check(got, expected, V, op_kw.get("return_probs", True))


RULE_CASES = [  # (case kwargs, op kwargs): dense q with the csd gate open, one-hot drafts, top-k with the zero block
    (dict(q="jacobi"), dict(coupling=1)),
    (dict(q=None, int_logits=True), dict(coupling=2, top_k=20)),
    (dict(q="sparse", seed_rows=True), dict(temperature=0.7)),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rule", ["gsd", "arsample", "lantern", "lantern++"])
@pytest.mark.parametrize("case_kw, op_kw", RULE_CASES)
def test_every_rule_matches_reference(rule, case_kw, op_kw, path):
    """Each rule on each path (gsd: the register path, its row sorted in one program), lantern's distortion gathered:
    tokens exactly, a(x) and the distortion within 1e-4 of reference.verify."""
    if path == "split" and op_kw.get("top_k"):
        pytest.skip("top-k runs on the per-position paths (plan never splits it)")
    if rule == "gsd" and (path != "register" or op_kw.get("coupling") == 1):
        pytest.skip("gsd runs on the register path, and never with the maximal coupling")
    V = 100
    case = make_case(2, 4, V, **case_kw)
    neighbours = ref.codebook_neighbours(torch.randn(V, 3, generator=torch.Generator().manual_seed(1)), 12)
    got, expected = run_both(case, path=path, rule=rule, neighbours=neighbours, gather_distortion=True, **op_kw)
    check(got, expected, V)
    assert torch.isfinite(got.distortion).all()
    if case_kw.get("q") is not None:  # one-hot drafts under top-k 20 of 100 mostly fall outside p's support (a = 0)
        assert (got.distortion > 0).any()  # the comparison has teeth


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rule", ["csd", "gsd", "arsample", "lantern", "lantern++"])
@pytest.mark.parametrize("gather_distortion", [True, False])
def test_uninformed_slots_are_decided_strictly(rule, path, gather_distortion):
    """informed (issue 45): a mixed mask on each path equals the reference (the rule where informed, strict where
    not); all False equals the strict rule bit for bit. gsd without its distortion: the first-stop launch too."""
    if rule == "gsd" and path != "register":
        pytest.skip("gsd runs on the register path")
    V = 100
    case = make_case(3, 6, V, q="jacobi", gen_seed=4)
    neighbours = ref.codebook_neighbours(torch.randn(V, 3, generator=torch.Generator().manual_seed(1)), 12)
    mask = torch.rand(3, 6, generator=torch.Generator().manual_seed(2)) < 0.5
    options = dict(path=path, rule=rule, neighbours=neighbours, gather_distortion=gather_distortion, tvd_threshold=1.0)
    got, expected = run_both(case, informed=mask, **options)
    check(got, expected, V)
    assert (got.distortion[~mask] == 0).all()
    none_informed, _ = run_both(case, informed=torch.zeros(3, 6, dtype=torch.bool), **options)
    strict, _ = run_both(case, **dict(options, rule="strict"))
    for field in ("accept_len", "tokens", "accept_prob", "distortion"):
        assert torch.equal(getattr(none_informed, field), getattr(strict, field)), field


GSD_POINTS = [  # (group_rank k, δ, case kwargs): k beyond V, δ = 0, a window over the whole row, tied p, one-hot q
    (12, 0.15, dict(q="jacobi")), (1, 0.0, dict(q="jacobi", start=2)), (3, 1.0, dict(q="jacobi")),
    (5000, 0.2, dict(q="jacobi", gen_seed=3)), (4, 0.05, dict(q="dense", int_logits=True)), (2, 0.1, dict(q=None)),
]


@pytest.mark.parametrize("k, delta, case_kw", GSD_POINTS, ids=lambda v: str(v) if not isinstance(v, dict) else "")
def test_gsd_decides_without_the_sorted_row_as_with_it(k, delta, case_kw):
    """gsd without its distortion decides from the draft's own group (no sort) and sorts only each row's first stop
    (a second launch) for its residual: the reference's tokens, and the same tokens, accepted lengths and a(x) as
    with the row sorted at every position (gather_distortion)."""
    case = make_case(3, 8, 200, **case_kw)
    options = dict(rule="gsd", coupling=0, temperature=0.8, group_rank=k, group_delta=delta)
    fast, expected = run_both(case, **options)
    sorted_, _ = run_both(case, gather_distortion=True, **options)
    check(fast, expected, 200)
    assert torch.equal(fast.tokens, sorted_.tokens) and torch.equal(fast.accept_len, sorted_.accept_len)
    torch.testing.assert_close(fast.accept_prob, sorted_.accept_prob, rtol=1e-6, atol=1e-9)
    assert fast.distortion.isnan().any() and sorted_.distortion.isfinite().all()


def test_chunked_top_k_matches_reference():
    case = make_case(1, 2, 100, int_logits=True)
    got, expected = run_both(case, path="chunked", top_k=7, coupling=2)
    check(got, expected, 100)


@pytest.mark.parametrize("path", PATHS)
def test_bad_inputs_over_many_blocks(path):
    V = 80
    case = make_case(2, 3, V, q="dense", start=1)
    c, q = case["target_logits"].clone(), case["draft_probs"].clone()
    c[0, 1, 50] = float("nan")  # (-inf masks a token: tests/test_masked_and_probs.py)
    q[1, 2, 70] = float("inf")
    case.update(target_logits=c, draft_probs=q)
    got, expected = run_both(case, path=path, coupling=2)
    check(got, expected, V)
    assert got.status.tolist()[0] & ref.STATUS_BAD_LOGITS and got.status.tolist()[1] & ref.STATUS_BAD_DRAFT_PROBS


def test_is_available():
    ok, reason = tv.is_available("cpu")
    assert ok == (os.environ.get("TRITON_INTERPRET") == "1" and tv._INTERPRET), reason
    if not torch.cuda.is_available():
        ok, reason = tv.is_available("cuda")
        assert not ok and "cuda" in reason.lower()
    ok, reason = tv.is_available("meta")
    assert not ok and reason
