"""Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) across Triton versions.

Before Triton 3.7 the interpreter reads a scalar kernel argument's value with ``int(array)`` on its shape-[1] numpy
array, which numpy >= 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"): every loop with a
runtime bound, ``for v0 in range(0, V, BLOCK_V)``, then fails. Later interpreters squeeze the array first;
:func:`squeeze_scalar_index` makes older ones do the same. Compiled kernels are not touched.
"""

from __future__ import annotations

import inspect
import os

__all__ = ["squeeze_scalar_index"]


def squeeze_scalar_index() -> bool:
    """Under the interpreter, ``tensor.__index__`` squeezes the scalar's array (as Triton >= 3.7 does). Returns
    whether the interpreter's tensor patch was wrapped (once per process)."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "squeezes_scalar_index", False):
        return False
    if list(inspect.signature(patch).parameters) != ["tensor", "scope"]:
        return False  # another interpreter layout: leave it as it is

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.squeezes_scalar_index = True
    interpreter._patch_lang_tensor = patched
    return True
