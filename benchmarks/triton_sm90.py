"""Registers and spills of every Triton kernel variant, compiled for sm_90 on a machine without a GPU.

    python benchmarks/triton_sm90.py [--quick] [--json benchmarks/results/triton_sm90.json]

Triton's compiler with a CUDA target (no device) and the ptxas bundled with Triton (-v). CI prints this table, so a
change that makes a kernel spill shows in review; see csd_kernels/backends/triton/report.py.
"""

import os

os.environ["TRITON_INTERPRET"] = "0"  # the report compiles; the interpreter would replace triton.jit

from csd_kernels.backends.triton.report import main  # noqa: E402

if __name__ == "__main__":
    main()
