"""Compile the Triton kernels for an NVIDIA target without a GPU and read ptxas' resource report.

Triton's compiler needs no device: ``ASTSource`` + ``triton.compiler.compile(target=GPUTarget("cuda", 90, 32))``
gives PTX, and the ptxas bundled with Triton (``-v``) prints registers and spill bytes per kernel. The test suite
compiles every variant this way (a kernel that no longer compiles for sm_90 fails on CPU-only CI) and
``benchmarks/triton_sm90.py`` prints the table, so a change that makes the register path spill shows in review.

    python -m csd_kernels.triton_report            # the table for sm_90
"""

from __future__ import annotations

import itertools
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Variant", "ResourceReport", "variants", "compile_variant", "format_table"]

_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class Variant:
    """One specialisation of the position kernel, as the launcher picks it for (V, options)."""

    vocab: int
    has_uncond: bool = True
    has_q: bool = True
    greedy: bool = False
    top_k: bool = False
    mode_csd: bool = True
    next_drafts: int = 0  # 0 independent, 1 maximal, 2 gumbel
    return_probs: bool = True
    logits_dtype: str = "bfloat16"

    @property
    def label(self) -> str:
        parts = [f"V={self.vocab}", "cfg" if self.has_uncond else "nocfg", "q" if self.has_q else "onehot",
                 "greedy" if self.greedy else ("topk" if self.top_k else "full"), "csd" if self.mode_csd else "strict",
                 ("indep", "maximal", "gumbel")[self.next_drafts], "probs" if self.return_probs else "noprobs"]
        return " ".join(parts)


@dataclass
class ResourceReport:
    variant: Variant
    kernel: str
    block: int
    num_warps: int
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int


def variants(vocabs=(8192, 16384, 65536)) -> list[Variant]:
    """The variants worth watching: the heaviest (CFG + q + top-k + csd + gumbel), the common one, greedy, one-hot."""
    out = []
    for vocab in vocabs:
        out.append(Variant(vocab, top_k=True, next_drafts=2))
        out.append(Variant(vocab))
        out.append(Variant(vocab, next_drafts=1, return_probs=False))
        out.append(Variant(vocab, greedy=True))
        out.append(Variant(vocab, has_q=False, mode_csd=False, has_uncond=False))
    return out


def _signature(kernel, variant: Variant) -> tuple[dict, dict]:
    logits = "*" + _DTYPE[variant.logits_dtype]
    pointers = {"logits_ptr": logits, "uncond_ptr": logits, "q_ptr": "*fp32", "draft_ptr": "*i64", "start_ptr": "*i64",
                "positions_ptr": "*i64", "seed_ptr": "*i64", "offset_ptr": "*i64", "probs_ptr": "*fp32",
                "ent_ptr": "*fp32", "tvd_ptr": "*fp32", "acc_ptr": "*fp32", "dist_ptr": "*fp32", "res_ptr": "*i32",
                "later_ptr": "*i32", "flags_ptr": "*i32"}
    floats = {"cfg_scale", "inv_t", "entropy_coef", "tvd_threshold"}
    constexprs = {"HAS_UNCOND": variant.has_uncond, "HAS_Q": variant.has_q, "GREEDY": variant.greedy,
                  "TOP_K": variant.top_k, "MODE_CSD": variant.mode_csd, "NEXT_DRAFTS": variant.next_drafts,
                  "RETURN_PROBS": variant.return_probs, "PER_ROW_SEED": False}
    signature = {}
    for name in kernel.arg_names:
        if name in pointers:
            signature[name] = pointers[name]
        elif name in floats:
            signature[name] = "fp32"
        elif name in constexprs or name == "BLOCK_V":
            signature[name] = "constexpr"
        else:
            signature[name] = "i32"
    return signature, constexprs


_PTXAS_LINE = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads.*?"
    r"Used (?P<regs>\d+) registers", re.S)


def _ptxas_report(ptx: str, arch: int) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        result = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}{suffix}", str(src), "-o", str(Path(tmp) / "k.cubin")],
                                capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ptxas failed:\n{result.stderr[-2000:]}")
    match = _PTXAS_LINE.search(result.stderr)
    if match is None:
        raise RuntimeError(f"cannot read ptxas -v output:\n{result.stderr[-2000:]}")
    return {"stack_bytes": int(match["stack"]), "spill_store_bytes": int(match["st"]),
            "spill_load_bytes": int(match["ld"]), "registers": int(match["regs"])}


def compile_variant(variant: Variant, arch: int = 90) -> ResourceReport:
    """Compile the kernel the launcher would pick for ``variant`` and read ptxas -v (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from . import triton_verify as tv

    kernel, block = tv.pick_kernel(variant.vocab)
    num_warps = tv.num_warps(block)
    signature, constexprs = _signature(kernel, variant)
    constexprs["BLOCK_V"] = block
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    options = {"num_warps": num_warps, "enable_fp_fusion": False}
    compiled = triton.compiler.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    report = _ptxas_report(compiled.asm["ptx"], arch)
    return ResourceReport(variant=variant, kernel=kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__,
                          block=block, num_warps=num_warps, **report)


def format_table(reports: list[ResourceReport]) -> str:
    header = f"{'variant':<52} {'kernel':<26} {'block':>6} {'warps':>5} {'regs':>5} {'spill st/ld B':>14} {'stack B':>8}"
    lines = [header, "-" * len(header)]
    for r in reports:
        lines.append(f"{r.variant.label:<52} {r.kernel:<26} {r.block:>6} {r.num_warps:>5} {r.registers:>5} "
                     f"{f'{r.spill_store_bytes}/{r.spill_load_bytes}':>14} {r.stack_bytes:>8}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table([compile_variant(v) for v in variants()]))
