"""Launch a ``@triton.jit`` kernel without Triton's per-call argument binder.

``kernel[grid](*args, **kw)`` binds and specializes every argument on every call (for the verify kernels' 40–60
arguments that is most of an eager call's host time). The first launch into a given cache goes through Triton as
usual and keeps the compiled kernel there; later launches call its launcher directly with the same arguments. One
cache must therefore serve one specialization: everything Triton specializes a launch on has to be fixed by the
caller's key for that cache — the dtype and 16-byte alignment of every pointer argument, the class of every integer
argument (equal to 1, a multiple of 16, 32- or 64-bit), the constexprs and the launch options. Profiling hooks
(``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``) and the interpreter always take Triton's own path.
"""

from __future__ import annotations

import os

from triton import knobs
from triton.runtime import driver

__all__ = ["launch"]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def launch(kernel, grid: tuple, cache: dict, args: tuple, constexprs: dict, **options) -> None:
    """``kernel[grid](*args, **constexprs, **options)``, with the compiled kernel kept in ``cache`` (the caller's
    dict for one specialization key, see the module docstring).

    ``args`` are the leading parameters of ``kernel`` in order; ``constexprs`` name the remaining ones.
    """
    if _INTERPRET or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        kernel[grid](*args, **constexprs, **options)
        return
    active = driver.active
    device = active.get_current_device()
    entry = cache.get((id(kernel), device))  # id: hashing a JITFunction is not cheap
    if entry is None:
        compiled = kernel[grid](*args, **constexprs, **options)
        if compiled is not None:  # None: a jit_cache_hook took over
            params = kernel.params[len(args):]
            tail = tuple(constexprs[p.name] if p.name in constexprs else p.default for p in params)
            cache[(id(kernel), device)] = (compiled, tail)
        return
    compiled, tail = entry
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 active.get_current_stream(device), compiled.function, compiled.packed_metadata, None, None, None,
                 *args, *tail)


def _hooked(hook) -> bool:
    """A launch hook is set (a profiler): None in older Triton, an empty HookChain in newer ones means none."""
    return hook is not None and bool(getattr(hook, "calls", True))
