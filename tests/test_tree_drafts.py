"""The sibling candidates of a draft tree (csd_kernels.ops.drafts.tree_candidates): the C++ extension on the CPU and
the Triton kernel (interpreter here, compiled for sm_90 without a GPU) return exactly reference.tree_candidates on
reference.tree_gumbel_uniforms — shared and per-row seeds, per-row offsets >= 2^32, rows without a main draft, q with
fewer than K - 1 tokens of mass left (-1), chunked vocabularies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from csd_kernels import reference as ref
from csd_kernels.backends.compiled import compiled_extension
from csd_kernels.ops import drafts


def _triton_candidates(*args, **kwargs):
    from csd_kernels.backends.triton import drafts as triton_drafts  # imports triton

    return triton_drafts.tree_candidates(*args, **kwargs)


def _case(batch: int, levels: int, vocab: int, seed: int, per_row: bool):
    """(seed, offset, main, q): random q with about a third zeros; row 0 level 0 with 2 tokens of mass, one the main
    draft; main = -1 on the last row's last level (unless that is row 0 level 0); row 0's last level's main draft a
    token q gives no mass."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, levels, vocab, generator=g) * 3
    logits[torch.rand(batch, levels, vocab, generator=g) < 0.3] = float("-inf")
    logits[..., 0] = 0.0  # every q has mass
    q = torch.softmax(logits, -1)
    q[0, 0] = 0.0
    q[0, 0, [1, vocab - 1]] = 0.5
    main = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, levels)
    main[-1, -1] = -1
    main[0, 0] = vocab - 1
    if levels > 1:
        main[0, -1] = int((q[0, -1] == 0).nonzero()[0, 0]) if bool((q[0, -1] == 0).any()) else main[0, -1]
    if per_row:
        seeds = torch.tensor([2**33 + 5, -3, 11, 0, 7, 2**40][:batch])
        offsets = torch.tensor([2**32 + 9, 0, 5, 2**62, 3, 1][:batch])
    else:
        seeds, offsets = torch.tensor([seed]), torch.tensor([2**40 + 1])
    return seeds, offsets, main, q


def _expected(seeds, offsets, main, q, branching, first):
    batch, levels, vocab = q.shape
    u = ref.tree_gumbel_uniforms(seeds, offsets, batch, first + levels, vocab, first=first)
    return ref.tree_candidates(main, q, branching, u)


CASES = [(1, 1, 7, 2), (3, 2, 7, 5), (2, 3, 512, 3), (4, 2, 512, 4), (2, 2, 16384, 2), (3, 1, 16384, 5)]


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("batch, levels, vocab, branching", CASES)
def test_cpp_tree_candidates_are_the_reference(batch, levels, vocab, branching, per_row):
    if compiled_extension() is None:
        pytest.skip("the C++ extension is not built")
    seeds, offsets, main, q = _case(batch, levels, vocab, seed=batch * 100 + vocab, per_row=per_row)
    want = _expected(seeds, offsets, main, q, branching, first=1)
    got = compiled_extension().tree_candidates(seeds, offsets, main, q, branching, 1)
    assert torch.equal(got, want)
    assert torch.equal(drafts.tree_candidates(seeds, offsets, main, q, branching, 1), want)
    assert bool((want[0, 0, 2:] == -1).all()) and want[0, 0, 1] == 1  # one token of mass besides the main draft


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("batch, levels, vocab, branching, block", [(1, 1, 7, 2, None), (3, 2, 7, 5, None),
                                                                    (2, 2, 100, 3, 16), (2, 1, 100, 4, 32)])
def test_triton_tree_candidates_are_the_reference(batch, levels, vocab, branching, block, per_row):
    """Under the interpreter (small V; block splits V into chunks to exercise the merge of kept and new keys)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seeds, offsets, main, q = _case(batch, levels, vocab, seed=batch * 10 + vocab, per_row=per_row)
    want = _expected(seeds, offsets, main, q, branching, first=1)
    args = (t.to(device) for t in (seeds, offsets, main, q))
    got = _triton_candidates(*args, branching, 1, block=block)
    assert torch.equal(got.cpu(), want)


def test_reference_ties_go_to_the_lowest_token():
    """Uniform q ties whenever two 23-bit uniforms do: equal keys rank by token, not by topk's unspecified order."""
    q = torch.full((1, 1, 64), 1 / 64)
    u = torch.full((1, 1, 64), 0.5)
    u[0, 0, 40] = 0.75  # the one largest key
    cand = ref.tree_candidates(torch.tensor([[2]]), q, 5, u)
    assert cand.tolist() == [[[2, 40, 0, 1, 3]]]


def test_tree_candidates_reject_bad_input():
    q, seed, offset = torch.full((2, 3, 8), 1 / 8), torch.tensor([1]), torch.tensor([0])
    main = torch.zeros(2, 3, dtype=torch.int64)
    for args, name in [((main[:, :2], q, 3, 1), "main_tokens"), ((main, q, 0, 1), "branching"),
                       ((main, q, 10, 1), "branching"), ((main, q, 3, -1), "first")]:
        with pytest.raises(ValueError, match=name):
            drafts.tree_candidates(seed, offset, *args)


def test_tree_candidates_kernel_compiles_for_sm90():
    code = ("import json; from csd_kernels.backends.triton.report import compile_tree_candidates_kernel as c; "
            "print(json.dumps([vars(c(16384, 5)), vars(c(7, 2))]))")
    result = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="0"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [row["kernel"] for row in rows] == ["tree_candidates_kernel"] * 2
    assert all(0 < row["registers"] <= 255 and row["spill_store_bytes"] == 0 for row in rows)


@pytest.mark.parametrize("offset, winner", [(332, 8198), (664, 2439)])
def test_uniform_q_ties_go_to_the_lowest_token_everywhere(offset, winner):
    """Uniform q, V = 16384: at these offsets (seed 5, level 1) the two largest uniforms are equal (8198 / 8564 and
    2439 / 9994): the reference, the C++ extension and the Triton kernel all pick the lower token."""
    seeds, offsets, main = torch.tensor([5]), torch.tensor([offset]), torch.tensor([[-1]])
    q = torch.full((1, 1, 16384), 1 / 16384)
    want = [[[-1, winner]]]
    assert _expected(seeds, offsets, main, q, 2, first=1).tolist() == want
    if compiled_extension() is not None:
        assert compiled_extension().tree_candidates(seeds, offsets, main, q, 2, 1).tolist() == want
    if os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        args = (t.to(device) for t in (seeds, offsets, main, q))
        assert _triton_candidates(*args, 2, 1).tolist() == want


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_q_gives_missing_candidates_like_the_reference(bad):
    """A NaN or +inf in q (invalid draft probabilities, flagged by the verification ops) ranks first with a
    non-finite key: -1 at that rank, the other candidates as the reference."""
    seeds, offsets, main, q = _case(2, 2, 512, seed=3, per_row=False)
    q[1, 0, 77] = bad
    want = _expected(seeds, offsets, main, q, 4, first=1)
    assert int(want[1, 0, 1]) == -1 and bool((want[1, 0, 2:] >= 0).all())
    if compiled_extension() is not None:
        assert torch.equal(compiled_extension().tree_candidates(seeds, offsets, main, q, 4, 1), want)
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert torch.equal(_triton_candidates(seeds, offsets, main, q, 4, 1, block=128), want)
