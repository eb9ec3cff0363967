"""Just-in-time build of csd_kernels._C for the running torch (opt-in: CSD_KERNELS_JIT=1): the sources and flags of
setup.py (backends/build_flags.py) compiled by torch.utils.cpp_extension.load into a cache directory keyed by the
torch and the sources, so that one compile serves every later process on that torch."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from . import build_flags as flags

ENV = "CSD_KERNELS_JIT"
CACHE_ENV = "CSD_KERNELS_CACHE"  # default ~/.cache/csd_kernels/jit
MODULE_NAME = "csd_kernels_C"  # TORCH_EXTENSION_NAME of the JIT build (the pybind module's name)


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def source_root() -> Path:
    """Where the sources are: the repository (editable install) or csd_kernels/_csrc (installed package)."""
    package = Path(__file__).resolve().parents[1]
    for root in (package.parent, package / "_csrc"):
        if all((root / name).is_file() for name in flags.CPU_SOURCES):
            return root
    raise FileNotFoundError(f"{ENV}=1 but the extension's sources are in neither {package.parent} nor "
                            f"{package / '_csrc'}; reinstall the package with `pip install --no-build-isolation .`")


def cache_dir(root: Path, info: dict, with_cuda: bool) -> Path:
    """One directory per (torch, C++ ABI, sources, flags, CUDA or not)."""
    key = hashlib.sha256(repr((flags.build_info_text(info), flags.tree_hash(str(root)), flags.CXX_FLAGS,
                               flags.NVCC_FLAGS, flags.LINK_FLAGS, with_cuda)).encode()).hexdigest()[:16]
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "csd_kernels", "jit")
    return Path(base) / f"torch-{info['torch']}-{key}"


def build(torch):
    """Compiles (once per cache_dir) and imports the extension for the running torch; returns the module."""
    from torch.utils import cpp_extension

    info = flags.build_info(torch)
    root = source_root()
    with_cuda = flags.cuda_wanted(torch, cpp_extension.CUDA_HOME)
    directory = cache_dir(root, info, with_cuda)
    flags.write_build_info_header(str(directory), info)
    if not any(directory.glob(f"{MODULE_NAME}*.so")):
        print(f"csd_kernels: compiling csd_kernels._C for torch {info['torch']} into {directory} (once; a few minutes)",
              file=sys.stderr)
    macros = [f"-D{flags.CUDA_MACRO}"] if with_cuda else []
    return cpp_extension.load(
        name=MODULE_NAME,
        sources=[str(root / name) for name in flags.sources(with_cuda)],
        extra_cflags=list(flags.CXX_FLAGS) + macros,
        extra_cuda_cflags=list(flags.NVCC_FLAGS) + macros,
        extra_ldflags=list(flags.LINK_FLAGS),
        extra_include_paths=[str(root / d) for d in flags.INCLUDE_DIRS] + [str(directory)],
        build_directory=str(directory),
        with_cuda=with_cuda,
        verbose=False,
    )
