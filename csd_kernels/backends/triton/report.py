"""Compile the Triton kernels for an NVIDIA target without a GPU and read ptxas' resource report.

Triton's compiler needs no device: ``ASTSource`` + ``triton.compiler.compile(target=GPUTarget("cuda", 90, 32))``
gives PTX, and the ptxas bundled with Triton (``-v``) prints registers and spill bytes per kernel. The test suite
compiles every variant this way (a kernel that no longer compiles for sm_90 fails on CPU-only CI) and
``benchmarks/triton_sm90.py`` prints the table, so a change that makes the register path spill shows in review.

    python -m csd_kernels.backends.triton.report [--quick] [--json rows.json]      # the table for sm_90
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...config.acceptance import RULES, rule_named
from ...text_table import text_table

__all__ = ["Variant", "ResourceReport", "variants", "compile_variant", "compile_tree_kernel", "format_table"]

_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class Variant:
    """One specialisation, as the launcher picks it for (B·L positions, V, options)."""

    vocab: int
    positions: int = 16
    has_uncond: bool = True
    has_q: bool = True
    greedy: bool = False
    top_k: bool = False
    rule: str = "csd"  # config/acceptance.py's name
    coupling: int = 0  # 0 independent, 1 maximal, 2 gumbel
    return_probs: bool = True
    logits_dtype: str = "bfloat16"
    top_p: bool = False  # top-p and min-p (the per-position paths)
    target_probs: bool = False  # probabilities instead of logits (float32, no CFG)
    int_words: bool = False  # seed and offset as int64 kernel arguments (an eager call's ints), not pointers
    gather_distortion: bool = False  # lantern's distortion (k gathers per token)

    @property
    def label(self) -> str:
        parts = [f"V={self.vocab}", "cfg" if self.has_uncond else "nocfg",
                 "q" if self.has_q else "onehot", "greedy" if self.greedy else ("topk" if self.top_k else "full"),
                 self.rule, ("indep", "maximal", "gumbel")[self.coupling],
                 "probs" if self.return_probs else "noprobs"]
        parts += ["top-p/min-p"] if self.top_p else []
        parts += ["target-probs"] if self.target_probs else []
        parts += ["int seed"] if self.int_words else []
        parts += ["gather-distortion"] if self.gather_distortion else []
        return " ".join(parts)


@dataclass
class ResourceReport:
    label: str  # the variant (or what the kernel does)
    kernel: str
    block: int
    num_warps: int
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int


def variants(vocabs=(8192, 16384, 65536), rules=tuple(r.name for r in RULES)) -> list[Variant]:
    """The variants worth watching: the heaviest (CFG + q + top-k + csd + gumbel, the register / chunked path), the
    common one, gumbel without probs, greedy, one-hot (the split path); then each relaxed rule of ``rules`` but csd on
    the common variant and, for lantern and gsd, with its gathered distortion (gsd: the register path only,
    V <= 16384; without its distortion also its second launch, the rows' first stops)."""
    out = []
    for vocab in vocabs:
        out.append(Variant(vocab, top_k=True, coupling=2))
        out.append(Variant(vocab))
        out.append(Variant(vocab, coupling=2, return_probs=False))
        out.append(Variant(vocab, greedy=True))
        out.append(Variant(vocab, has_q=False, rule="strict", has_uncond=False))
        for rule in map(rule_named, rules):
            if rule.sorts_row and vocab > 16384 or rule.name in ("strict", "csd"):  # (both in the variants above)
                continue
            out.append(Variant(vocab, rule=rule.name))
            if rule.distortion_gathers:
                out.append(Variant(vocab, rule=rule.name, top_k=True, gather_distortion=True))
    return out


_POINTERS = {"q_ptr": "*fp32", "draft_ptr": "*i64", "start_ptr": "*i64", "positions_ptr": "*i64", "seed_ptr": "*i64",
             "offset_ptr": "*i64", "probs_ptr": "*fp32", "ent_ptr": "*fp32", "tvd_ptr": "*fp32", "acc_ptr": "*fp32",
             "dist_ptr": "*fp32", "res_ptr": "*i32", "later_ptr": "*i32", "flags_ptr": "*i32", "stats_ptr": "*fp32",
             "index_ptr": "*i32", "sums_ptr": "*fp32", "bad_q_ptr": "*i32", "position_count_ptr": "*i32",
             "row_count_ptr": "*i32", "tokens_ptr": "*i64", "accept_len_ptr": "*i32", "status_ptr": "*i32",
             "nb_ptr": "*i64", "gsd_ptr": "*fp32"}


def _settings_signature(rule: str):
    """The types of the ``st`` argument (verify.KernelSettings) for ``rule``: its parameters as many fp32s."""
    from .verify import KernelSettings

    return KernelSettings("fp32", "fp32", "i32", "fp32", "fp32", "fp32", ("fp32",) * len(rule_named(rule).params))


def _signature(kernel, variant: Variant, constexprs: dict) -> dict:
    logits = "*" + _DTYPE[variant.logits_dtype]
    signature = {}
    for name in kernel.arg_names:
        if name in ("logits_ptr", "uncond_ptr"):
            signature[name] = logits
        elif name in ("seed_ptr", "offset_ptr") and variant.int_words:
            signature[name] = "i64"
        elif name in _POINTERS:
            signature[name] = _POINTERS[name]
        elif name == "st":
            signature[name] = _settings_signature(variant.rule)
        elif name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = "i32"
    return signature


def _divisibility(kernel, signature: dict) -> dict:
    """Pointers, strides and V divisible by 16, as Triton's launcher specialises them for the usual shapes."""
    kinds = {name: kind if isinstance(kind, str) else "tuple" for name, kind in signature.items()}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
               if kinds[name].startswith("*") or name == "V" or (name.startswith("s_") and kinds[name] == "i32")}
    return aligned


_PTXAS_LINE = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads.*?"
    r"Used (?P<regs>\d+) registers", re.S)


def _ptxas_report(ptx: str, arch: int) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas

    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        result = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}{suffix}", str(src), "-o",
                                 str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ptxas failed:\n{result.stderr[-2000:]}")
    match = _PTXAS_LINE.search(result.stderr)
    if match is None:
        raise RuntimeError(f"cannot read ptxas -v output:\n{result.stderr[-2000:]}")
    return {"stack_bytes": int(match["stack"]), "spill_store_bytes": int(match["st"]),
            "spill_load_bytes": int(match["ld"]), "registers": int(match["regs"])}


def _kernels(variant: Variant):
    """[(jit kernel, constexprs, num_warps)] the launcher would run for ``variant``."""
    from ...config.acceptance import RULE_CODES
    from . import verify as tv
    from .kernels import chunked, register, split

    nucleus = variant.top_p and not variant.greedy
    chosen = tv.plan(variant.positions, variant.vocab, (variant.top_k and not variant.greedy) or nucleus
                     or variant.target_probs or rule_named(variant.rule).sorts_row)
    flags = {"HAS_UNCOND": variant.has_uncond, "HAS_Q": variant.has_q, "GREEDY": variant.greedy,
             "RULE": RULE_CODES[variant.rule], "COUPLING": variant.coupling, "RETURN_PROBS": variant.return_probs,
             "PER_ROW_SEED": False, "SEED_VALUE": variant.int_words, "OFFSET_VALUE": variant.int_words,
             "GATHER_DIST": variant.gather_distortion}
    if chosen.path != "split":
        kernel = register.position_kernel if chosen.path == "register" else chunked.position_chunked_kernel
        constexprs = dict(flags, TOP_K=variant.top_k and not variant.greedy, BLOCK_V=chosen.block, TOP_P=nucleus,
                          MIN_P=nucleus, PROBS=variant.target_probs)
        rows = [dict(constexprs, GSD_ROWS=True)] if tv.first_stop_launch(flags) else []
        return [(kernel, c, chosen.num_warps) for c in [constexprs, *rows]]
    n_split = -(-variant.vocab // chosen.block)
    stats = {"HAS_UNCOND": variant.has_uncond, "GREEDY": variant.greedy, "PER_ROW_SEED": False,
             "GUMBEL": variant.coupling == 2 and not variant.greedy, "BLOCK_V": chosen.block,
             "SEED_VALUE": variant.int_words}
    finish = dict(flags, BLOCK_V=chosen.block, S_BLOCK=max(2, 1 << (n_split - 1).bit_length()), BLOCK_L=16)
    return [(split.split_stats_kernel, stats, chosen.num_warps), (split.split_finish_kernel, finish, chosen.num_warps)]


def compile_variant(variant: Variant, arch: int = 90) -> list[ResourceReport]:
    """Compile the kernels the launcher would run for ``variant`` and read ptxas -v (no GPU needed)."""
    reports = []
    for kernel, constexprs, num_warps in _kernels(variant):
        defaults = {p.name: p.default for p in kernel.params if p.is_constexpr and p.name not in constexprs}
        constexprs = dict(defaults, **constexprs)  # a constexpr the launcher leaves at its default is one still
        if "s_qv" in kernel.arg_names:
            constexprs = dict(constexprs, s_qv=1)  # Triton's launcher specialises a unit stride to a constant
        resources = _compile(kernel, _signature(kernel, variant, constexprs), constexprs, num_warps, arch)
        label = variant.label + (" first stops" if constexprs.get("GSD_ROWS") else "")
        reports.append(ResourceReport(label, kernel.fn.__name__, constexprs["BLOCK_V"], num_warps, **resources))
    return reports


def compile_draft_kernel(arch: int = 90) -> ResourceReport:
    """The fresh-draft-token kernel of the decoding loop (kernels/drafts.py)."""
    from .kernels.drafts import draft_tokens_kernel

    constexprs = {"PER_ROW_SEED": True, "BLOCK_L": 16}
    signature = {name: "constexpr" if name in constexprs else "*i64" if name.endswith("_ptr") else "i32"
                 for name in draft_tokens_kernel.arg_names}
    resources = _compile(draft_tokens_kernel, signature, constexprs, 1, arch)
    return ResourceReport("fresh draft tokens, L=16", "draft_tokens_kernel", 16, 1, **resources)


def compile_tree_candidates_kernel(vocab: int = 16384, branching: int = 3, arch: int = 90) -> ResourceReport:
    """The sibling-candidate kernel of the tree loop (kernels/tree_candidates.py)."""
    from .drafts import candidate_block
    from .kernels.tree_candidates import tree_candidates_kernel

    block = candidate_block(vocab)
    constexprs = {"PER_ROW_SEED": True, "SIBLINGS": branching - 1,
                  "BLOCK_K": max(2, 1 << (branching - 2).bit_length()), "BLOCK_V": block}
    signature = {name: "constexpr" if name in constexprs else "*fp32" if name == "q_ptr"
                 else "*i64" if name.endswith("_ptr") else "i32" for name in tree_candidates_kernel.arg_names}
    resources = _compile(tree_candidates_kernel, signature, constexprs, 4, arch)
    return ResourceReport(f"tree candidates V={vocab} K={branching}", "tree_candidates_kernel", block, 4, **resources)


def compile_tree_kernel(vocab: int = 16384, *, greedy: bool = False, top_k: bool = False, rule: str = "csd",
                        logits_dtype: str = "bfloat16", arch: int = 90) -> ResourceReport:
    """The tree verification kernel (kernels/tree.py) with CFG, as verify_tree.py launches it."""
    from ...config.acceptance import RULE_CODES
    from .kernels.tree import tree_kernel
    from .verify import register_num_warps
    from .verify_tree import tree_block

    block = tree_block(vocab)
    constexprs = {"HAS_UNCOND": True, "GREEDY": greedy, "TOP_K": top_k and not greedy, "TOP_P": top_k and not greedy,
                  "MIN_P": top_k and not greedy, "RULE": RULE_CODES[rule], "PER_ROW_SEED": True, "BLOCK_V": block,
                  "BLOCK_M": 64, "s_qv": 1, "s_sv": 1, "GATHER_DIST": False, "HAS_INFORMED": False}
    logits = "*" + _DTYPE[logits_dtype]
    signature = {}
    for name in tree_kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("logits_ptr", "uncond_ptr"):
            signature[name] = logits
        elif name in ("q_ptr", "sib_ptr", "scratch_ptr", "acc_ptr", "ent_ptr", "tvd_ptr", "dist_ptr"):
            signature[name] = "*fp32"
        elif name == "status_ptr":
            signature[name] = "*i32"
        elif name.endswith("_ptr"):
            signature[name] = "*i64"
        else:
            signature[name] = _settings_signature(rule) if name == "st" else "i32"
    num_warps = register_num_warps(block)
    resources = _compile(tree_kernel, signature, constexprs, num_warps, arch)
    label = (f"tree V={vocab} cfg {'greedy' if greedy else 'top-k/p/min-p' if top_k else 'full'} "
             f"{rule} {_DTYPE[logits_dtype]}")
    return ResourceReport(label, "tree_kernel", block, num_warps, **resources)


def _compile(kernel, signature: dict, constexprs: dict, num_warps: int, arch: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs,
                                       attrs=_divisibility(kernel, signature))
    options = {"num_warps": num_warps, "enable_fp_fusion": False}
    compiled = triton.compiler.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return _ptxas_report(compiled.asm["ptx"], arch)


def format_table(reports: list[ResourceReport]) -> str:
    columns = [("variant", "<52"), ("kernel", "<24"), ("block", ">6"), ("warps", ">5"), ("regs", ">5"),
               ("spill st/ld B", ">14"), ("stack B", ">8")]
    return text_table(columns, ([r.label, r.kernel, str(r.block), str(r.num_warps), str(r.registers),
                                 f"{r.spill_store_bytes}/{r.spill_load_bytes}", str(r.stack_bytes)] for r in reports))


def quick_variants() -> list[Variant]:
    """One of each kernel: split (small batch), register (large batch, heaviest), chunked (top-k above 16384)."""
    return [Variant(16384, 16), Variant(16384, 16, greedy=True, coupling=2, return_probs=False),
            Variant(16384, 1024, top_k=True, coupling=2), Variant(65536, 16, top_k=True, coupling=1),
            Variant(16384, 16, top_k=True, top_p=True, coupling=2),
            Variant(65536, 16, top_k=True, top_p=True, coupling=2, logits_dtype="float32"),
            Variant(16384, 16, has_uncond=False, target_probs=True, coupling=2, logits_dtype="float32"),
            Variant(65536, 16, has_uncond=False, target_probs=True, coupling=1, logits_dtype="float32"),
            Variant(16384, 16, coupling=2, int_words=True), Variant(16384, 16, top_k=True, int_words=True),
            Variant(65536, 16, top_k=True, int_words=True)]


def main(argv=None) -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Registers and spills of the Triton kernels, compiled without a GPU")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--quick", action="store_true", help="one variant of each kernel")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    reports = [r for v in (quick_variants() if args.quick else variants()) for r in compile_variant(v, args.arch)]
    reports.append(compile_draft_kernel(args.arch))
    reports.append(compile_tree_kernel(arch=args.arch))
    reports.append(compile_tree_candidates_kernel(arch=args.arch))
    print(format_table(reports))
    if args.json:
        rows = [dict(variant=r.label, kernel=r.kernel, block=r.block, num_warps=r.num_warps,
                     registers=r.registers, spill_store_bytes=r.spill_store_bytes,
                     spill_load_bytes=r.spill_load_bytes, stack_bytes=r.stack_bytes) for r in reports]
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
