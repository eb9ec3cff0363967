"""Build of csd-kernels and its compiled extension csd_kernels._C.

    pip install --no-build-isolation -e .      # or `pip install --no-build-isolation .`

--no-build-isolation builds against the torch already installed in the environment (the extension must match the
torch it is loaded into); pyproject.toml lists the build requirements for isolated builds.

The extension is csd_kernels._C: python/bindings.cpp + the CPU kernels (csrc/cpu/verify.cpp, verify_tree.cpp,
tree_candidates.cpp). When torch has CUDA (torch.version.cuda) and nvcc / CUDA_HOME is found, it becomes a
CUDAExtension that also compiles the CUDA kernels (csrc/cuda/verify*.cu + their glue .cpp, -DCSD_WITH_CUDA).
Environment:
    CSD_KERNELS_CUDA=0    never build the CUDA kernel
    CSD_KERNELS_CUDA=1    require it (error when torch has no CUDA or nvcc is missing)
    CSD_KERNELS_CUDA_ARCH (optional) TORCH_CUDA_ARCH_LIST to use, default "8.0;9.0" when unset

A build reuses the extension already in csd_kernels/ when its stamp (csd_kernels/_C.stamp: a hash of csrc/, python/,
setup.py, the torch it was built against and the compiler flags, plus the hash of the built file) is current: pip's
builds compile in a fresh temporary directory each time, so without it every `pip install -e .` recompiled.
"""

import hashlib
import json
import os
import shutil
import warnings

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_INPUTS = ("csrc", "python", "setup.py")  # what the extension is compiled from, relative to ROOT
STAMP = os.path.join("csd_kernels", "_C.stamp")
ZOO_MODELS = ("digits", "scenes")  # csd_kernels.zoo.<name>: code, weights/ (package data: no __init__.py) and README


# setuptools' notice after every editable install (`pip install -e .`, scripts/install.sh) that a folder named like the
# package in the working directory would be imported first: information on editable installs, nothing to fix here
warnings.filterwarnings("ignore", message=r"Editable installation\.")
# torch warns when it is imported without numpy (a fresh environment installs numpy with this package, after this
# build has imported torch); the build itself uses no numpy
warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy")


def _cuda_wanted(torch, cuda_home):
    flag = os.environ.get("CSD_KERNELS_CUDA", "").strip().lower()
    have_torch_cuda = bool(getattr(torch.version, "cuda", None))
    have_nvcc = cuda_home is not None and (
        os.path.exists(os.path.join(cuda_home, "bin", "nvcc")) or shutil.which("nvcc") is not None
    )
    if flag in ("0", "false", "no", "off"):
        return False
    if flag in ("1", "true", "yes", "on"):
        if not have_torch_cuda:
            raise RuntimeError(
                "CSD_KERNELS_CUDA=1 but the installed torch has no CUDA (torch.version.cuda is None); "
                "install a CUDA build of torch or unset CSD_KERNELS_CUDA"
            )
        if not have_nvcc:
            raise RuntimeError("CSD_KERNELS_CUDA=1 but nvcc was not found (set CUDA_HOME or put nvcc on the PATH)")
        return True
    return have_torch_cuda and have_nvcc


def _extensions():
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:  # metadata-only operations (sdist, egg_info) without torch
        return [], {}

    # -fopenmp: at::parallel_for is header code and only runs in parallel when compiled with OpenMP (the runtime is
    # the libgomp that torch already loads). -ffp-contract=off / no fast-math: IEEE fp32 like the reference.
    cxx = ["-O3", "-g0", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno", "-Wno-psabi",
           "-fopenmp"]
    sources = ["python/bindings.cpp", "csrc/cpu/verify.cpp", "csrc/cpu/verify_tree.cpp", "csrc/cpu/tree_candidates.cpp"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    if _cuda_wanted(torch, cpp_extension.CUDA_HOME):
        if "TORCH_CUDA_ARCH_LIST" not in os.environ:
            os.environ["TORCH_CUDA_ARCH_LIST"] = os.environ.get("CSD_KERNELS_CUDA_ARCH", "8.0;9.0")
        ext = cpp_extension.CUDAExtension(
            "csd_kernels._C",
            sources + ["csrc/cuda/verify.cu", "csrc/cuda/verify_split.cu", "csrc/cuda/verify_glue.cpp",
                       "csrc/cuda/verify_tree.cu", "csrc/cuda/tree_glue.cpp"],
            include_dirs=include_dirs,
            define_macros=[("CSD_WITH_CUDA", None)],
            extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "--fmad=false", "-std=c++17", "-lineinfo"]},
            extra_link_args=["-fopenmp"],
        )
    else:
        ext = cpp_extension.CppExtension(
            "csd_kernels._C", sources, include_dirs=include_dirs, extra_compile_args={"cxx": cxx},
            extra_link_args=["-fopenmp"],
        )
    return [ext], {"build_ext": _reusing_build_ext(cpp_extension.BuildExtension.with_options(use_ninja=True),
                                                   torch_build_id(torch))}


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
        install_requires=["torch>=2.4", "numpy"],
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
