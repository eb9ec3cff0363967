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
"""

import os
import shutil

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


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
    build_ext = cpp_extension.BuildExtension.with_options(use_ninja=True)
    return [ext], {"build_ext": build_ext}


ext_modules, cmdclass = _extensions()

MODELS = ["transformers>=4.52", "safetensors"]  # the Janus / Lumina-mGPT adapters and checkpoint loaders
CLI = MODELS + ["tqdm", "pillow", "matplotlib", "scikit-learn", "scipy"]  # the csd command and the shipped zoo models
TEST = CLI + ["pytest", "pytest-benchmark", "hypothesis", "triton", "ruff"]

setup(
    name="csd-kernels",
    version="0.1.0",
    description="Fused kernels for Content-aware Speculative Decoding (CSD) verification",
    packages=find_packages(include=["csd_kernels", "csd_kernels*"]),
    package_data={"csd_kernels.zoo.digits": ["weights/*", "README*"],
                  "csd_kernels.zoo.scenes": ["weights/*", "README*"]},
    include_package_data=True,
    python_requires=">=3.9",
    # the kernels need torch and numpy only; the model adapters, the csd command and the tests are extras
    install_requires=["torch>=2.4", "numpy"],
    extras_require={
        "models": MODELS,
        "cli": CLI,
        "test": TEST,
        "all": sorted(set(CLI + ["triton"])),
    },
    entry_points={"console_scripts": ["csd = csd_kernels.cli:main"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
