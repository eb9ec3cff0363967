"""The ``csd`` command's parser: its subcommands and flags, and the checks of the flags that need no model (by the
API's own rules, :mod:`csd_kernels.config.generation`). Torch-free: ``csd --help``, ``csd --version`` and a refused flag
answer without importing torch; the commands themselves are in commands.py.

The generation flags are GenerationConfig's fields (those with ``flag="every"``): each is ``--name-with-dashes``,
typed and helped by its field, its default the model's.
"""

from __future__ import annotations

import argparse
import re

from .. import __version__
from ..config.acceptance import GRID_RULES, rule_named
from ..config.generation import DEFAULT_COUPLING, MODES, RULES, GenerationConfig, check, check_generate
from ..config.modes import TREE_MODES
from ..constants import BACKENDS, COUPLINGS
from ..fileio.inputs import quote
from ..models import registry
from ..runner.usage import UsageError, as_flags

__all__ = ["build_parser", "check_flags", "check_prompts", "sweep_lists", "GENERATION_FLAGS", "add_model_options",
           "add_generation_options"]

GENERATION_FLAGS = GenerationConfig.names(flag="every")  # the generation flags every sampling command takes
# the command line's own checked flags, by subcommand ({flag's keyword: its rule in RULES}; GenerationConfig's are
# checked for generate, compare and run)
_COMMAND_FLAGS = {"generate": {"seed": "seed", "num": "num", "image_size": "image_size"},
                  "compare": {"seeds": "seeds", "num": "compare_num", "image_size": "image_size"},
                  "run": {"seed": "seed", "batch_size": "batch_size", "num_threads": "num_threads",
                          "image_size": "image_size"},
                  "sweep": {"per_class": "per_class", "images": "images", "seeds": "seeds", "workers": "workers"}}
_UNSET_ALLOWED = ("per_class", "images")  # csd sweep: the model says which applies (and its default)


def _help(rule: str, text: str, default) -> str:
    """Help of a checked flag: what it is, the accepted values (RULES[rule], config.generation) and the default."""
    return f"{text}; {RULES[rule].expected.removeprefix('None or ')} (default: {default})".replace("%", "%%")


def add_model_options(parser: argparse.ArgumentParser, device: bool = True) -> None:
    """--model (one of zoo.MODELS: the shipped models, then the registry's families with a loader) and the local
    checkpoint it runs (see the family's models/<family>/command.py)."""
    models = ", ".join(f"{entry.name} ({entry.help})" for entry in registry.command_models()).replace("%", "%%")
    parser.add_argument("--model", default="digits", help=f"one of {models} (default: digits)")
    parser.add_argument("--weights", help="llamagen: the GPT .pt; lumina-mgpt, janus-pro, emu3: the checkpoint folder "
                                          "(default: none; digits ships its weights)")
    parser.add_argument("--config", help="llamagen: the upstream model name (GPT-B, GPT-L, GPT-XL, ...) or a JSON file "
                                         "of its ModelArgs fields (default: none)")
    parser.add_argument("--vq", help="llamagen: the VQ checkpoint (vq_ds16_c2i.pt), for pixels (default: none, "
                                     "tokens only)")
    parser.add_argument("--image-size", dest="image_size", type=int,
                        help=_help("image_size", "llamagen: the checkpoint's resolution in pixels",
                                   "read from a _256/_384 in its name"))
    parser.add_argument("--size", help="lumina-mgpt: image size in pixels, 768 or WIDTHxHEIGHT (default: 768); "
                                       "emu3: the same, multiples of 8 (default: 720)")
    parser.add_argument("--dtype", help="bfloat16 / float16 / float32 (default: bfloat16 on a GPU, float32 on a CPU)")
    if device:
        parser.add_argument("--device", help="cpu, cuda or cuda:N (default: the GPU when one is visible, else cpu)")


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """GenerationConfig's flag="every" fields, one flag each (unset ones fall back to the model's defaults): typed by
    the field's rule (a choice that cannot be None is argparse's choices), helped by its text."""
    for name in GENERATION_FLAGS:
        info = GenerationConfig.field_info(name)
        rule, shown = info["rule"], info["shown"] or info["default"]
        options = {}
        if rule is not None and rule.kind == "bool":
            options["action"] = argparse.BooleanOptionalAction
        elif rule is not None and rule.kind == "choice" and not rule.optional:
            options["choices"] = rule.choices
        elif rule is not None:
            options["type"] = {"int": int, "real": float}.get(rule.kind, str)
        text = info["help"] if rule is None else f"{info['help']}; {rule.expected.removeprefix('None or ')}"
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                            help=f"{text} (default: the model's, else {shown})".replace("%", "%%"), **options)


def _tree_flag(text: str) -> tuple:
    """--tree K,D -> (K, D) ints; their bounds and what they go with: validation.check_tree."""
    try:
        branching, depth = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K,D: two ints, e.g. 3,2 (got {text!r})") from None
    return branching, depth


def _add_sampling(parser: argparse.ArgumentParser, num: int) -> None:
    add_model_options(parser)
    parser.add_argument("--prompt", required=True, help="the prompt (digits, llamagen: a class id; others: text)")
    rule, text = ("compare_num", "images per run, at least 2 (a spread and a Fréchet distance are of a set)") \
        if parser.prog.endswith("compare") else ("num", "images per run")
    parser.add_argument("--num", type=int, default=num, help=_help(rule, text, num))
    add_generation_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar (default: shown); csd compare still "
                                                             "prints a line as each run finishes")


class _Parser(argparse.ArgumentParser):
    """An unparsable command line is one line too (argparse would print the usage first), exit status 2."""

    def error(self, message: str):
        message = re.sub(r"'([^']{81,})'", lambda long: quote(long.group(1)), " ".join(message.split()))
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="csd", description="Content-aware speculative decoding of AR image models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate images, write PNGs, maps and stats.json")
    _add_sampling(gen, num=16)
    gen.add_argument("--mode", default="csd", choices=MODES, help="decoding mode (default: csd)")
    gen.add_argument("--coupling", choices=sorted(COUPLINGS),
                     help=f"next drafts of sjd/csd (default: {DEFAULT_COUPLING}; other modes: independent)")
    gen.add_argument("--seed", type=int, default=0, help=_help("seed", "seed of image 0 (image b: seed + b)", 0))
    gen.add_argument("--tree", type=_tree_flag, metavar="K,D",
                     help="a draft tree in every window (docs/trees.md; lossless with sjd): K candidates per position "
                          "at the first D positions, e.g. 3,2; K, D >= 1, (K^D - 1)/(K - 1) < the window; --mode "
                          f"{' or '.join(TREE_MODES)}, --coupling maximal (default: none, a chain)")
    gen.add_argument("--out", default="out", help="output folder: csd generate replaces the images of its earlier "
                                                  "runs there and refuses a folder with other files (default: out)")
    gen.set_defaults(handler="cmd_generate")

    cmp = commands.add_parser("compare", help="ar, sjd and each relaxed rule's mode on the same prompts and seeds: "
                                                 "speed and quality")
    _add_sampling(cmp, num=64)
    cmp.add_argument("--seeds", type=int, default=3, help=_help("seeds", "repeats with different seeds, for the "
                                                                         "spread", 3))
    cmp.add_argument("--out", default="out/compare", help="output folder (default: out/compare)")
    cmp.set_defaults(handler="cmd_compare")

    bench = commands.add_parser("bench", help="microbenchmarks of the verify op on every available backend")
    bench.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when a GPU is visible, else cpu)")
    bench.add_argument("--backends", nargs="*", help=f"any of {', '.join(BACKENDS)} that run on the device "
                                                     "(default: every available backend, not Triton's interpreter)")
    bench.add_argument("--quick", action="store_true", help="two shapes instead of six (default: six)")
    bench.add_argument("--out", default="benchmarks/results", help="output folder (default: benchmarks/results)")
    bench.set_defaults(handler="cmd_bench")

    sweep = commands.add_parser("sweep", help="the speed-quality frontier: every mode, csd over a grid of lambda x tau "
                                              "x coupling, mean and spread over seeds (JSON, CSV, plot)")
    sweep.add_argument("--model", default="digits", help="a zoo model with quality measures: digits or scenes "
                                                         "(default: digits)")
    sweep.add_argument("--weights", help="scenes: a folder with a trained model (config.json, model.safetensors) "
                                         "instead of the shipped one (default: the shipped weights)")
    sweep.add_argument("--per-class", dest="per_class", type=int,
                       help=_help("per_class", "digits: images per class per seed", 8))
    sweep.add_argument("--images", type=int,
                       help=_help("images", "scenes: images per seed, from a fixed prompt mix (1-3 objects)", 64))
    sweep.add_argument("--gsd-ranks", dest="gsd_ranks",
                       help="gsd group_rank values k, each an int >= 1: gsd over k x --gsd-deltas besides gsd at its "
                            "defaults (default: none)")
    sweep.add_argument("--gsd-deltas", dest="gsd_deltas",
                       help="gsd group_delta values, each >= 0 (default: none; with --gsd-ranks alone: "
                            f"{GenerationConfig().group_delta})")
    sweep.add_argument("--grid", action="append", metavar="PARAM=V1,V2,...",
                       help="another rule over values of its parameter (repeatable), e.g. lantern_delta=0.05,0.1,0.2, "
                            "lantern_lambda=2,5,10, arsample_scale=4.5,9,18, arsample_offset=0.05,0.2: each rule "
                            "with a swept parameter over their product (default: none)")
    sweep.add_argument("--seeds", type=int, default=3, help=_help("seeds", "seeds 0..N-1", 3))
    sweep.add_argument("--lambdas", default="0,0.05,0.1,0.25,0.5,1",
                       help="csd entropy_coef values, each >= 0 (default: 0,0.05,0.1,0.25,0.5,1)")
    sweep.add_argument("--taus", default="0.3,0.65,1", help="csd tvd_threshold values, each in [0, 1] "
                                                           "(default: 0.3,0.65,1)")
    sweep.add_argument("--couplings", default="independent,maximal",
                       help=f"csd couplings, any of {', '.join(COUPLINGS)} (default: independent,maximal)")
    sweep.add_argument("--trees", default="2x2,3x2", help="draft trees KxD of the sjd+maximal+tree settings, "
                       "comma-separated, or none (default: 2x2,3x2)")
    sweep.add_argument("--windows", default=None,
                       help="more draft windows, each an int >= 1: the sjd and csd chain settings again at each "
                            "(labels ' W32') (default: none, the model's window only)")
    sweep.add_argument("--workers", type=int, default=2, help=_help("workers", "processes, one torch thread each", 2))
    sweep.add_argument("--out", default="out/sweep/frontier",
                       help="path prefix of the .json, .csv and .png (default: out/sweep/frontier)")
    sweep.set_defaults(handler="cmd_sweep")

    run = commands.add_parser("run", help="sharded, resumable generation of a prompts file over modes "
                                          "(torchrun --nproc-per-node N -m csd_kernels run ...)")
    _add_run_arguments(run)
    run.set_defaults(handler="cmd_run")
    return parser


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, device=False)  # each rank runs on its own device
    parser.add_argument("--prompts", required=True, help="prompts file: one prompt per line (digits: a class id 0..9)")
    parser.add_argument("--modes", default="ar,sjd,csd", help=f"comma-separated modes, any of {', '.join(MODES)} "
                                                              "(default: ar,sjd,csd)")
    parser.add_argument("--out", required=True, help="output folder (rerun the same command to resume)")
    parser.add_argument("--seed", type=int, default=0, help=_help("seed", "global seed", 0))
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=16,
                        help=_help("batch_size", "images per generate() call on each rank (does not change the "
                                                 "images)", 16))
    parser.add_argument("--coupling", choices=sorted(COUPLINGS),
                        help=f"next drafts of sjd/csd (default: {DEFAULT_COUPLING})")
    parser.add_argument("--tree", type=_tree_flag, metavar="K,D",
                        help=f"a draft tree for the run's {', '.join(TREE_MODES)} items (docs/trees.md), e.g. 3,2; "
                             f"--modes must hold {' or '.join(TREE_MODES)} (default: none, a chain)")
    add_generation_options(parser)
    parser.add_argument("--num-threads", dest="num_threads", type=int,
                        help=_help("num_threads", "torch threads per process", "CPU cores / processes on this node"))
    parser.add_argument("--quiet", action="store_true", help="no progress bar or table (default: shown)")




# ----------------------------------------------------------------------------------------------------------------------
# the checks that need no model (nor torch)
# ----------------------------------------------------------------------------------------------------------------------
def check_flags(args: argparse.Namespace) -> None:
    """The subcommand's flags that the API's rules judge alone, checked before the command imports torch: the
    generation flags (as GenerationConfig's fields, with --mode and --coupling), the command line's own (--num,
    --seed, ...), then the prompts by the model's grammar (:func:`check_prompts`). An ArgumentError names the keyword;
    main() says the flag. What needs torch or the model (--device, whether --backend runs there, --tree against the
    window, the checkpoint files) the commands check."""
    command = args.command
    if command in ("generate", "compare", "run"):
        given = {name: getattr(args, name) for name in GENERATION_FLAGS if getattr(args, name, None) is not None}
        # (csd run's coupling applies to its sjd and csd items; compare runs its own couplings)
        check_generate(getattr(args, "mode", "csd"), getattr(args, "coupling", None), **given)
    for name, rule in _COMMAND_FLAGS.get(command, {}).items():
        if getattr(args, name) is not None or name not in _UNSET_ALLOWED:
            RULES[rule].check(name, getattr(args, name))
    if command == "sweep":
        sweep_lists(args)
    check_prompts(args)


def sweep_lists(args: argparse.Namespace) -> tuple:
    """csd sweep's lists, each value checked by the rule of the setting it sets (errors name the flag): (λs, τs,
    couplings, gsd (k, δ) pairs: --gsd-ranks x --gsd-deltas, one of them alone with generate()'s default for the
    other, windows, {param: values} of --grid)."""
    couplings = tuple(args.couplings.split(","))
    with as_flags(coupling="--couplings"):
        for coupling in couplings:
            check("coupling", coupling)
    gsd = ()
    if args.gsd_ranks or args.gsd_deltas:
        ranks = _numbers(args.gsd_ranks, "--gsd-ranks", "group_rank", int) if args.gsd_ranks else (
            GenerationConfig().group_rank,)
        deltas = _numbers(args.gsd_deltas, "--gsd-deltas", "group_delta") if args.gsd_deltas else (
            GenerationConfig().group_delta,)
        gsd = tuple((k, delta) for k in ranks for delta in deltas)
    windows = _numbers(args.windows, "--windows", "window", int) if args.windows else ()
    return (_numbers(args.lambdas, "--lambdas", "entropy_coef"), _numbers(args.taus, "--taus", "tvd_threshold"),
            couplings, gsd, windows, _grid_values(args.grid))


def _grid_values(items) -> dict:
    """--grid PARAM=V1,V2 (repeatable) -> {param: values}: the parameters of the rules swept by --grid
    (config/acceptance.GRID_RULES), each value checked by its parameter's rule."""
    swept = {p.name: p for rule in GRID_RULES for p in rule_named(rule).params}
    values = {}
    for item in items or ():
        name, _, text = item.partition("=")
        if name not in swept or not text:
            raise UsageError(f"--grid {quote(item)}: expected PARAM=V1,V2,... with PARAM one of {', '.join(swept)} "
                             "(csd: --lambdas/--taus, gsd: --gsd-ranks/--gsd-deltas)")
        values[name] = _numbers(text, f"--grid {name}", name, int if swept[name].check.kind == "int" else float)
    return values


def _numbers(text: str, flag: str, setting: str, kind=float) -> tuple:
    """Comma-separated values of generate()'s ``setting``, each checked by its rule (errors name ``flag``)."""
    try:
        values = tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated numbers, got {quote(text)}") from None
    with as_flags(**{setting: flag}):
        return tuple(check(setting, value) for value in values)


def check_prompts(args: argparse.Namespace) -> None:
    """--model, then --prompt (generate, compare) or every line of --prompts (run) by the model's grammar
    (csd_kernels.zoo.check_prompts): a bad prompt is refused before any model loads."""
    from .. import zoo  # (torch-free: the models' prompt grammars only)

    if args.command not in ("generate", "compare", "run"):
        return
    if args.model not in zoo.MODEL_NAMES:
        raise UsageError(f"--model {quote(args.model)}: unknown model; choose from {', '.join(zoo.MODEL_NAMES)}")
    if args.command == "run":
        zoo.check_prompt_file(args.model, args.prompts)
        return
    try:
        zoo.check_prompts(args.model, [args.prompt])
    except ValueError as exc:
        raise UsageError(f"--prompt: {exc}") from exc
