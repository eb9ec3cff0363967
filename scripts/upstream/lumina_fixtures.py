"""Golden values for tests/test_lumina.py, computed by Lumina-mGPT's own code.

Runs OUTSIDE the package, in a venv with Lumina-mGPT's dependencies (its modeling code needs transformers 4.44):

    python3 -m venv /tmp/lumina_venv
    /tmp/lumina_venv/bin/pip install torch==2.13.0 transformers==4.44.2 safetensors sentencepiece pillow pyyaml numpy
    /tmp/lumina_venv/bin/python scripts/upstream/lumina_fixtures.py --upstream /path/to/Lumina-mGPT

and writes tests/fixtures/lumina/:

* tokenizer/     a tiny byte-level BPE tokenizer with Chameleon's special-token names (trained here);
* prompts.json   the prompt ids of Lumina-mGPT's FlexARInferenceSolver.generate for a few (text, width, height);
* <case>.json    per tiny checkpoint of tests/lumina_tiny.py: the config.json and index that upstream's
                 ``save_pretrained`` wrote, every tensor's name/shape/digest, and upstream's image logits
                 (conditional and CFG-unconditional, a column subset plus per-position logsumexp and argmax over all
                 8192 image codes) and greedy image tokens (CFG 3.0) for the prompt ids.

Nothing of Lumina-mGPT is copied: its modules are imported from --upstream. Two things are adapted at run time, both
for a CPU-only machine: ``inference_solver``'s logits processor allocates on "cuda" (the source is loaded with
device="cpu" instead), and FlexARItemProcessor's constructor loads Meta's VQ-GAN from ./ckpts (the item processor is
built with the constructor of its base class, MMConvItemProcessor, with the arguments FlexARItemProcessor passes;
text-only prompts never reach the VQ-GAN).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "lumina"

# prompts of prompts.json: (text, width, height); the first one drives the checkpoint cases
PROMPTS = [
    ("a red fox in the snow", 96, 64),
    ("Image of a dog playing water, and a water fall is in the background.", 768, 768),
    ("Ein Fuchs im Schnee \u2014 \u96ea\u306e\u4e2d\u306e\u72d0\nzweite Zeile", 512, 1024),
]
SECOND_PROMPT = ("a blue bird on a branch", 96, 64)  # a second row for the batched greedy check
CFG_SCALE = 3.0
IMAGE_TOP_K = 2000
# logits columns kept in the fixture (image code ids 0..8191): the first 16 and every 128th
COLUMNS = list(range(16)) + list(range(16, 8192, 128))
IMAGE_START, IMAGE_END, ROW_END, SIZE_OFFSET, FIRST_CODE, NUM_CODES = 8197, 8196, 8803, 8804, 4, 8192


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def upstream_modules(root: Path) -> types.SimpleNamespace:
    sys.path[:0] = [str(root / "lumina_mgpt"), str(root)]
    from data.convertsation import Conversation
    from data.item_processor import FlexARItemProcessor
    from model import ChameleonXLLMXConfig, ChameleonXLLMXForConditionalGeneration
    from model.chameleon import ChameleonForConditionalGeneration
    from xllmx.data.item_processor import MMConvItemProcessor

    source = (root / "lumina_mgpt" / "inference_solver.py").read_text()
    assert source.count('device="cuda"') == 4, "inference_solver.py changed: check the CPU adaptation"
    solver = types.ModuleType("inference_solver")
    solver.__file__ = str(root / "lumina_mgpt" / "inference_solver.py")
    exec(compile(source.replace('device="cuda"', 'device="cpu"'), solver.__file__, "exec"), solver.__dict__)
    return types.SimpleNamespace(
        Conversation=Conversation, FlexARItemProcessor=FlexARItemProcessor, MMConvItemProcessor=MMConvItemProcessor,
        XLLMXConfig=ChameleonXLLMXConfig, XLLMX=ChameleonXLLMXForConditionalGeneration,
        Chameleon=ChameleonForConditionalGeneration, solver=solver,
    )


# ----------------------------------------------------------------------------------------------------------------------
# tokenizer and prompts
# ----------------------------------------------------------------------------------------------------------------------
def train_tiny_tokenizer(out: Path) -> None:
    """A byte-level BPE with Chameleon's special-token names (<reserved08706> is the turn separator)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [t for t, _, _ in PROMPTS] + [SECOND_PROMPT[0]] + [
        "Generate an image of 768x768 according to the following prompt:",
        "a photo of a cat sitting on a mat in the sun", "the quick brown fox jumps over the lazy dog",
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<reserved08706>", "<racm3:break>", "<eoss>", "<reserved08799>"]
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(out))


def item_processor(up, tokenizer_dir: Path):
    """FlexARItemProcessor for text-only prompts: its base constructor with FlexARItemProcessor's arguments."""
    proc = up.FlexARItemProcessor.__new__(up.FlexARItemProcessor)
    up.MMConvItemProcessor.__init__(proc, {"<|image|>": proc.process_image}, ["<|image|>"], str(tokenizer_dir),
                                    up.Conversation)
    return proc


class _Captured(Exception):
    pass


class _PromptCatcher:
    """Stands in for the model in FlexARInferenceSolver.generate: stops at model.generate with the prompt ids."""

    device = torch.device("cpu")
    config = types.SimpleNamespace(max_position_embeddings=4096)

    def generate(self, prompt, *args, **kwargs):
        raise _Captured(prompt[0].tolist())


def solver_prompt_ids(up, proc, text: str, width: int, height: int) -> list:
    """The ids FlexARInferenceSolver.generate feeds the model, with the qas of Lumina-mGPT's generate_examples."""
    solver = up.solver.FlexARInferenceSolver.__new__(up.solver.FlexARInferenceSolver)
    solver.model, solver.item_processor, solver.dtype = _PromptCatcher(), proc, torch.float32
    question = f"Generate an image of {width}x{height} according to the following prompt:\n{text}"
    try:
        solver.generate(images=[], qas=[[question, None]], max_gen_len=8192, temperature=1.0,
                        logits_processor=up.solver.LogitsProcessorList())
    except _Captured as caught:
        return caught.args[0]
    raise RuntimeError("FlexARInferenceSolver.generate did not call model.generate")


# ----------------------------------------------------------------------------------------------------------------------
# checkpoints and golden values
# ----------------------------------------------------------------------------------------------------------------------
def write_upstream_checkpoint(up, tiny, case: str, path: Path) -> dict:
    """Lumina-mGPT's own class and save_pretrained, as its finetune solver saves: without the VQ encoder."""
    _, seed, shard = tiny.CASES[case]
    torch.manual_seed(0)
    model = up.XLLMX(up.XLLMXConfig(**tiny.case_config(case)))
    del model.model.vqmodel  # finetune_solver.py: `del model.model.vqmodel` before training and saving
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    model.load_state_dict(tiny.seeded_weights(shapes, seed), strict=True)
    model = model.to(torch.bfloat16)
    kwargs = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(str(path), safe_serialization=True, **kwargs)
    return shapes


def read_back(tiny, path: Path) -> tuple:
    from safetensors import safe_open

    config = json.loads((path / "config.json").read_text())
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    files = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    tensors = {}
    for file in files:
        with safe_open(str(path / file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                tensors[name] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                                 "digest": tiny.tensor_digest(t), "file": file}
    return config, index, tensors


def image_sequence(codes: list, grid: tuple) -> list:
    """[image start, size h, size w, rows of codes each + row end, image end] in Lumina-mGPT's ids."""
    height, width = grid
    seq = [IMAGE_START, SIZE_OFFSET + height // 2, SIZE_OFFSET + width // 2]
    for r in range(height):
        seq += [FIRST_CODE + c for c in codes[r * width:(r + 1) * width]] + [ROW_END]
    return seq + [IMAGE_END]


@torch.no_grad()
def image_logits(model, context: list, codes: list, grid: tuple) -> torch.Tensor:
    """Upstream logits [H*W, 8192] over the image codes at the positions that predict each grid token."""
    height, width = grid
    seq = context + image_sequence(codes, grid)[:-1]
    logits = model(input_ids=torch.tensor([seq])).logits[0].float()  # [T, vocab]
    start = len(context) + 2  # the position of size_w predicts the first code
    rows = []
    for k in range(height * width):
        rows.append(start + k + k // width)  # each finished row adds a row-end input
    return logits[rows, FIRST_CODE:FIRST_CODE + NUM_CODES]


def logits_summary(logits: torch.Tensor) -> dict:
    return {"columns": logits[:, COLUMNS].tolist(), "logsumexp": torch.logsumexp(logits, -1).tolist(),
            "argmax": logits.argmax(-1).tolist()}


@torch.no_grad()
def upstream_greedy(up, model, prompt: list, grid: tuple) -> list:
    """Greedy image tokens through transformers' generate with the solver's own logits processors (CFG, image
    constraint / forced row ends and image end, image top-k), the image prefix given, as our adapter gives it."""
    from transformers import GenerationConfig

    height, width = grid
    solver = up.solver.FlexARInferenceSolver.__new__(up.solver.FlexARInferenceSolver)
    solver.model = model
    solver.item_processor = types.SimpleNamespace(
        image_start_token="<racm3:break>", image_end_token="<eoss>", new_line_token="<reserved08799>",
        token2id={"<racm3:break>": IMAGE_START, "<eoss>": IMAGE_END, "<reserved08799>": ROW_END}.__getitem__)
    processors = solver.create_logits_processor(cfg=CFG_SCALE, image_top_k=IMAGE_TOP_K)
    prefix = image_sequence([0] * height * width, grid)[:3]
    body = height * (width + 1) + 1  # rows with their row ends, then the image end
    config = GenerationConfig(max_new_tokens=body, do_sample=False, top_k=None, eos_token_id=[8710])
    out = model.generate(torch.tensor([prompt + prefix]), config, logits_processor=processors)[0].tolist()
    image = out[len(prompt) + 3:]
    assert len(image) == body and image[-1] == IMAGE_END, image
    codes = []
    for r in range(height):
        row = image[r * (width + 1):(r + 1) * (width + 1)]
        assert row[-1] == ROW_END, row
        codes += [t - FIRST_CODE for t in row[:-1]]
    assert all(0 <= c < NUM_CODES for c in codes)
    return codes


def case_fixture(up, tiny, case: str, prompts: list, work: Path) -> dict:
    path = work / case
    write_upstream_checkpoint(up, tiny, case, path)
    config, index, tensors = read_back(tiny, path)
    model = up.Chameleon.from_pretrained(str(path), torch_dtype=torch.float32).eval()  # the solver's class
    grid = tiny.GRID
    gen = torch.Generator().manual_seed(7)
    codes = torch.randint(0, NUM_CODES, (grid[0] * grid[1],), generator=gen).tolist()
    prefix = image_sequence(codes, grid)[:3]
    cond = image_logits(model, prompts[0], codes, grid)
    uncond = image_logits(model, [], codes, grid)  # CFG context: the image from its start token on, nothing before
    greedy = [upstream_greedy(up, model, p, grid) for p in prompts]
    return {
        "case": case, "grid": list(grid), "seed": tiny.CASES[case][1], "config": config, "index": index,
        "tensors": tensors, "prompts": prompts, "image_prefix": prefix, "codes": codes,
        "cond": logits_summary(cond), "uncond": logits_summary(uncond), "columns": COLUMNS,
        "cfg_scale": CFG_SCALE, "greedy": greedy,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, type=Path, help="a Lumina-mGPT checkout")
    parser.add_argument("--out", type=Path, default=FIXTURES)
    parser.add_argument("--keep", type=Path, help="also keep the upstream-written checkpoints here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    up = upstream_modules(args.upstream.resolve())
    tiny = load_module("lumina_tiny", REPO / "tests" / "lumina_tiny.py")

    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = args.out / "tokenizer"
    train_tiny_tokenizer(tokenizer_dir)
    proc = item_processor(up, tokenizer_dir)
    prompts = [{"text": t, "width": w, "height": h, "ids": solver_prompt_ids(up, proc, t, w, h)} for t, w, h in PROMPTS]
    (args.out / "prompts.json").write_text(json.dumps(prompts, indent=1, ensure_ascii=False) + "\n")
    case_prompts = [prompts[0]["ids"], solver_prompt_ids(up, proc, *SECOND_PROMPT)]

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        for case in tiny.CASES:
            fixture = case_fixture(up, tiny, case, case_prompts, work)
            (args.out / f"{case}.json").write_text(json.dumps(fixture) + "\n")
            print(case, "greedy", fixture["greedy"])


if __name__ == "__main__":
    main()
