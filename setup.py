"""Build of csd-kernels and its compiled extension csd_kernels._C.

    pip install --no-build-isolation -e .      # or `pip install --no-build-isolation .`

The extension must match the torch it is loaded into, so it is built against the torch already installed in the
environment: a build whose environment has no torch, or pip's own (an isolated build: `pip install .` without
--no-build-isolation), is refused in one line. The build records that torch (version, C++ ABI) in the extension;
csd_kernels/backends/compiled.py reads the record before loading it (docs/development.md#the-build).

The extension is csd_kernels._C: python/bindings.cpp + the CPU kernels (csrc/cpu/*.cpp). When torch has CUDA
(torch.version.cuda) and nvcc / CUDA_HOME is found, it becomes a CUDAExtension that also compiles the CUDA kernels
(csrc/cuda/verify*.cu + their glue .cpp, -DCSD_WITH_CUDA). The sources and flags are those of
csd_kernels/backends/build_flags.py, shared with the just-in-time build (CSD_KERNELS_JIT=1); the C++ standard is the
one torch's cpp_extension adds.

Environment:
    CSD_KERNELS_CUDA=0    never build the CUDA kernel
    CSD_KERNELS_CUDA=1    require it (error when torch has no CUDA or nvcc is missing)
    CSD_KERNELS_CUDA_ARCH (optional) TORCH_CUDA_ARCH_LIST to use, default "8.0;9.0" when unset

A build reuses the extension already in csd_kernels/ when its stamp (csd_kernels/_C.stamp: a hash of csrc/, python/,
setup.py, build_flags.py, the torch it was built against and the compiler flags, plus the hash of the built file) is
current: pip's builds compile in a fresh temporary directory each time, so without it every `pip install -e .`
recompiled.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import warnings

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
FLAGS_FILE = os.path.join("csd_kernels", "backends", "build_flags.py")  # sources and flags, shared with the JIT
SPEC_FILE = os.path.join("csd_kernels", "backends", "spec.py")  # the ops' arguments (build_flags.ops_contract)
BUILD_INPUTS = ("csrc", "python", "setup.py", FLAGS_FILE, SPEC_FILE)  # what the extension is compiled from (from ROOT)
STAMP = os.path.join("csd_kernels", "_C.stamp")
ZOO_MODELS = ("digits", "scenes")  # csd_kernels.zoo.<name>: code, weights/ (package data: no __init__.py) and README


# setuptools' notice after every editable install (`pip install -e .`, scripts/install.sh) that a folder named like the
# package in the working directory would be imported first: information on editable installs, nothing to fix here
warnings.filterwarnings("ignore", message=r"Editable installation\.")
# torch warns when it is imported without numpy (a fresh environment installs numpy with this package, after this
# build has imported torch); the build itself uses no numpy
warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy")


def _load_build_flags():
    """FLAGS_FILE by path (the package itself imports torch, which a build may not have yet)."""
    spec = importlib.util.spec_from_file_location("csd_kernels_build_flags", os.path.join(ROOT, FLAGS_FILE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flags = _load_build_flags()
BUILD_ARGV = sys.argv if __name__ == "__main__" else []  # as pip runs it; not when tests import it
BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "install", "develop", "editable_wheel", "bdist_egg"}
REFUSAL = ("csd-kernels compiles its extension against the torch already installed, and this build environment has "
           "{what} (pip isolates builds unless told not to): install torch, then `pip install --no-build-isolation .`")


def _builds(argv) -> bool:
    return any(arg in BUILD_COMMANDS for arg in argv[1:])


def _check_build_torch(torch, argv):
    """Refuses, in one line, a build whose torch is missing or is pip's own (an isolated build environment): its
    extension would be made for a torch other than the one that loads it."""
    if not _builds(argv):
        return
    if torch is None:
        raise SystemExit(REFUSAL.format(what="no torch"))
    if any(part in torch.__file__ for part in ("pip-build-env-", "build-env-")):
        raise SystemExit(REFUSAL.format(what=f"its own torch {torch.__version__} ({os.path.dirname(torch.__file__)})"))


def _extensions():
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:  # metadata-only operations (sdist, egg_info) without torch; a build is refused
        _check_build_torch(None, BUILD_ARGV)
        return [], {}
    _check_build_torch(torch, BUILD_ARGV)

    info = flags.build_info(torch)
    generated = flags.write_build_info_header(
        os.path.join(ROOT, "build", "generated", hashlib.sha256(flags.build_info_text(info).encode()).hexdigest()[:16]),
        info)
    include_dirs = [os.path.join(ROOT, d) for d in flags.INCLUDE_DIRS] + [generated]
    cxx, link = list(flags.CXX_FLAGS), list(flags.LINK_FLAGS)
    if flags.cuda_wanted(torch, cpp_extension.CUDA_HOME):
        if "TORCH_CUDA_ARCH_LIST" not in os.environ:
            os.environ["TORCH_CUDA_ARCH_LIST"] = os.environ.get("CSD_KERNELS_CUDA_ARCH", flags.DEFAULT_CUDA_ARCH)
        ext = cpp_extension.CUDAExtension(
            "csd_kernels._C", flags.sources(with_cuda=True), include_dirs=include_dirs,
            define_macros=[(flags.CUDA_MACRO, None)],
            extra_compile_args={"cxx": cxx, "nvcc": list(flags.NVCC_FLAGS)}, extra_link_args=link,
        )
    else:
        ext = cpp_extension.CppExtension(
            "csd_kernels._C", flags.sources(with_cuda=False), include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx}, extra_link_args=link,
        )
    return [ext], {"build_ext": _reusing_build_ext(cpp_extension.BuildExtension.with_options(use_ninja=True),
                                                   torch_build_id(torch)),
                   "build_py": _build_py_with_sources()}


def _build_py_with_sources():
    from setuptools.command.build_py import build_py

    class BuildPyWithSources(build_py):
        """Ships the extension's sources as csd_kernels/_csrc/ (their own layout), for the just-in-time build
        (CSD_KERNELS_JIT=1) of an installed package run on another torch."""

        def run(self):
            super().run()
            if self.editable_mode:  # an editable install compiles from the repository itself
                return
            for top in flags.SOURCE_DIRS:
                self.copy_tree(os.path.join(ROOT, top), os.path.join(self.build_lib, "csd_kernels", "_csrc", top))

    return BuildPyWithSources


def torch_build_id(torch):
    return f"{torch.__version__} {torch.version.git_version}"


def _file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def source_hash(root, torch_id, ext):
    """Hash of what the extension is built from: the files of BUILD_INPUTS (paths relative to root and contents),
    the torch it builds against (torch_build_id), the extension's sources and flags as setup.py made them (before
    torch's BuildExtension adds its own, which follow from the torch) and the CUDA architectures asked for. Absolute
    include paths are left out: the same tree elsewhere is the same build."""
    digest = hashlib.sha256(repr((torch_id, ext.sources, ext.extra_compile_args, ext.define_macros,
                                  ext.extra_link_args, os.environ.get("TORCH_CUDA_ARCH_LIST"))).encode())
    for name in BUILD_INPUTS:
        top = os.path.join(root, name)
        paths = [top] if os.path.isfile(top) else sorted(
            os.path.join(d, f) for d, dirs, files in os.walk(top) for f in files if "__pycache__" not in d)
        for path in paths:
            digest.update(os.path.relpath(path, root).encode() + b"\0" + _file_sha256(path).encode())
    return digest.hexdigest()


def is_current(root, built, sources):
    """Whether ``built`` (a compiled extension under root) was built from ``sources`` (source_hash) by the stamp."""
    try:
        with open(os.path.join(root, STAMP)) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return False
    return os.path.exists(built) and stamp == {"sources": sources, "built": _file_sha256(built)}


def write_stamp(root, built, sources):
    with open(os.path.join(root, STAMP), "w") as f:
        json.dump({"sources": sources, "built": _file_sha256(built)}, f)


def _reusing_build_ext(base, torch_id):
    class ReusingBuildExt(base):
        """torch's BuildExtension that skips the compilation when csd_kernels/ holds a current build (is_current)."""

        def build_extensions(self):
            self._hashes = {ext.name: source_hash(ROOT, torch_id, ext) for ext in self.extensions}
            self._compiled = []
            super().build_extensions()

        def build_extension(self, ext):
            in_place = os.path.join(ROOT, self.get_ext_filename(ext.name))
            if not is_current(ROOT, in_place, self._hashes[ext.name]):
                super().build_extension(ext)
                self._compiled.append(ext.name)
                return
            print(f"{ext.name}: {os.path.relpath(in_place, ROOT)} is current ({STAMP}), not rebuilt")
            built = self.get_ext_fullpath(ext.name)
            if os.path.abspath(built) != os.path.abspath(in_place):
                self.mkpath(os.path.dirname(built))
                shutil.copyfile(in_place, built)

        def copy_extensions_to_source(self):
            """In-place builds (setup.py --inplace, pip install -e) copy into csd_kernels/ what was compiled, and
            stamp it; a reused extension is left as it is (rewriting a loaded .so can crash the process using it)."""
            everything, self.extensions = self.extensions, [e for e in self.extensions if e.name in self._compiled]
            try:
                super().copy_extensions_to_source()
            finally:
                self.extensions = everything
            for name in self._compiled:  # one extension, csd_kernels._C, so one stamp
                write_stamp(ROOT, os.path.join(ROOT, self.get_ext_filename(name)), self._hashes[name])

    return ReusingBuildExt


ext_modules, cmdclass = _extensions()

MODELS = ["transformers>=4.52", "safetensors"]  # the Janus / Lumina-mGPT adapters and checkpoint loaders
CLI = MODELS + ["tqdm", "pillow", "matplotlib", "scikit-learn", "scipy"]  # the csd command and the shipped zoo models
TEST = CLI + ["pytest", "pytest-benchmark", "hypothesis", "triton", "ruff"]

if __name__ == "__main__":  # as pip and `python setup.py` run it; tests/test_packaging.py imports it
    setup(
        name="csd-kernels",
        version="0.1.0",
        description="Fused kernels for Content-aware Speculative Decoding (CSD) verification",
        packages=find_packages(include=["csd_kernels", "csd_kernels.*"]),
        # the weights are data of their model's package; include_package_data would treat their folders as packages
        package_data={f"csd_kernels.zoo.{name}": ["weights/*", "README*"] for name in ZOO_MODELS},
        include_package_data=False,
        python_requires=">=3.9",
        # the kernels need torch and numpy only; the model adapters, the csd command and the tests are extras
        install_requires=["torch>=2.11", "numpy"],  # the oldest torch built and tested (docs/development.md#the-build)
        extras_require={
            "models": MODELS,
            "cli": CLI,
            "test": TEST,
            "all": sorted(set(CLI + ["triton"])),
        },
        entry_points={
            "console_scripts": ["csd = csd_kernels.cli:main"],
            # off unless CSD_KERNELS_VLLM / CSD_KERNELS_SGLANG name a rule (docs/drop-in.md)
            "vllm.general_plugins": ["csd_kernels = csd_kernels.integrations.vllm:register"],
            "sglang.srt.plugins": ["csd_kernels = csd_kernels.integrations.sglang:register"],
        },
        ext_modules=ext_modules,
        cmdclass=cmdclass,
        zip_safe=False,
    )
