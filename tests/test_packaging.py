"""A kernel-only install (no extras): ``import csd_kernels`` and ``ck.verify`` need torch and numpy alone."""

import subprocess
import sys

EXTRAS_ONLY = ("transformers", "safetensors", "matplotlib", "sklearn", "PIL", "tqdm")

SCRIPT = """
import torch
import csd_kernels as ck
import csd_kernels.models, csd_kernels.decoding  # importable; they need the extras only when used
logits = torch.randn(2, 4, 50)
res = ck.verify(logits, torch.randint(0, 50, (2, 4)), torch.softmax(torch.randn(2, 4, 50), -1), seed=1)
print(res.accept_len.tolist(), ck.available_backends())
"""


def test_kernel_only_install_imports_and_verifies(tmp_path):
    """Each extras-only package is shadowed by one whose import fails, as if it were not installed."""
    for name in EXTRAS_ONLY:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed (test)')\n")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "TRITON_INTERPRET": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("[")
