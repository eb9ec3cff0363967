"""Every Triton kernel compiles for sm_90 without a GPU, and the split kernels keep their registers (no spills).

Compiled in a subprocess with the interpreter off (this suite switches TRITON_INTERPRET=1 on for CPU tensors, and
the interpreter replaces triton.jit). benchmarks/triton_sm90.py prints the full register/spill table.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm90") / "rows.json"
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-m", "csd_kernels.backends.triton.report", "--quick", "--json", str(out)],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text())


def test_every_kernel_compiles_for_sm90(report):
    kernels = {row["kernel"] for row in report}
    assert kernels == {"split_stats_kernel", "split_finish_kernel", "position_kernel", "position_chunked_kernel",
                       "draft_tokens_kernel", "tree_kernel", "tree_candidates_kernel"}
    assert all(0 < row["registers"] <= 255 for row in report)


def test_split_kernels_do_not_spill(report):
    for row in report:
        if row["kernel"].startswith("split_"):
            assert row["spill_store_bytes"] == 0 and row["spill_load_bytes"] == 0, row
            assert row["num_warps"] <= 8 and row["block"] <= 4096, row
