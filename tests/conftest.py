"""Shared test set-up.

Triton runs on CPU only through its interpreter, which must be switched on before triton is first imported, so the
suite sets it here: every test then sees the 'triton' backend for CPU tensors.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
