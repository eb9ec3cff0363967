"""A Janus-sized test-bed that ships with the package: colour scenes of 24x24 = 576 tokens from a 4096-code tokenizer,
prompted by attributes, with an exact pixel-level measure of prompt adherence.

* :mod:`.world` – the procedural world (render a scene from a seed) and the prompt grammar.
* :mod:`.checker` – adherence from pixels alone, background kind, a Fréchet distance to rendered scenes.
* :mod:`.tokenizer` – 4x4-patch k-means tokenizer (4096 codes).
* :mod:`.model` – the prompt tokens and the LlamaGen-style GPT (a small ``LlamaForCausalLM``).
* :mod:`.train` – ``python -m csd_kernels.zoo.scenes.train --out DIR`` (resumable).
"""

from .world import BACKGROUNDS, CELLS, COLOURS, SHAPES, parse_prompt, random_prompts, render  # noqa: F401

DEFAULT_CFG = 2.0  # chosen by AR adherence over cfg x top-k, 200 images (the README of this model)
DEFAULT_TOP_K = 200

__all__ = ["BACKGROUNDS", "CELLS", "COLOURS", "SHAPES", "DEFAULT_CFG", "DEFAULT_TOP_K", "parse_prompt",
           "random_prompts", "render", "zoo_model"]


def zoo_model(device=None, weights=None):
    """The shipped scenes model as a :class:`csd_kernels.zoo.ZooModel` (adapter, prompt parser, defaults, quality);
    ``weights``: a folder with a trained model instead (config.json, model.safetensors; its tokenizer.safetensors if
    it has one, else the shipped tokenizer). ValueError, one line, when the model's files are missing."""
    from pathlib import Path

    from ...config.generation import GenerationConfig
    from ...fileio.inputs import check_folder
    from ...models import ImageGPT
    from .. import Measure, ZooModel
    from .model import NULL_TOKEN_ID, NUM_CODES, TOKENIZER_FILE, WEIGHTS_DIR, load_lm, load_tokenizer
    from .prompts import grammar
    from .tokenizer import GRID

    folder = Path(WEIGHTS_DIR if weights is None else weights)
    flag = "--weights" if weights is not None else "--model scenes: the shipped weights,"
    check_folder(str(folder), flag, "a scenes model folder (config.json, model.safetensors; train one with python -m "
                 "csd_kernels.zoo.scenes.train --out DIR)", ("config.json", "model.safetensors"))
    _check_vocabulary(folder, flag)
    own = (folder / TOKENIZER_FILE).is_file()
    tokenizer = load_tokenizer(folder if own else None, flag if own else "--model scenes: the shipped tokenizer,")
    lm = load_lm(folder, flag=flag) if device is None else load_lm(folder, flag=flag).to(device)
    model = ImageGPT(lm, image_token_range=(0, NUM_CODES), grid=GRID, null_token_id=NULL_TOKEN_ID,
                     decode=lambda tokens: tokenizer.decode(tokens.cpu()), codebook=tokenizer.centroids)
    parse, measure, ceiling = _prompts_and_quality(tokenizer, device)
    measures = (Measure("adherence", "adherence", True, "prompt adherence (objects read from pixels)"),
                Measure("frechet", "Fréchet", False, "Fréchet distance to rendered scenes of the prompts", ".2f",
                        log_scale=True),
                Measure("background_accuracy", "background", True, "background kind read from pixels"))
    return ZooModel("scenes", model, parse, defaults=GenerationConfig(cfg_scale=DEFAULT_CFG, top_k=DEFAULT_TOP_K),
                    quality=measure, heldout_quality=ceiling,
                    prompt_help=grammar(),
                    measures=measures, ceiling_label="rendered scenes, tokenizer round trip")


def _check_vocabulary(folder, flag: str) -> None:
    """A model of another world (its prompt tokens laid out for other backgrounds) would read every prompt wrong."""
    from ...fileio.inputs import InputError, read_json
    from .model import VOCAB_SIZE

    path = str(folder / "config.json")
    vocab = read_json(path, flag).get("vocab_size")
    if vocab != VOCAB_SIZE:
        raise InputError(flag, path, f"a model of vocabulary {vocab}; this world's scenes model has {VOCAB_SIZE} "
                         f"({len(BACKGROUNDS)} backgrounds: {', '.join(BACKGROUNDS)}); retrain with python -m "
                         "csd_kernels.zoo.scenes.train --out DIR")


def _prompts_and_quality(tokenizer, device):
    """(prompt parser, quality, ceiling) of a scenes model with ``tokenizer``."""
    from . import checker
    from .model import prompt_ids

    def parse(prompts: list[str]) -> dict:
        ids = prompt_ids(list(prompts))
        return {"input_ids": ids if device is None else ids.to(device)}

    def measure(tokens, prompts: list[str]) -> dict:
        return checker.scene_quality(tokenizer.decode(tokens.cpu()).numpy(), prompts)

    def ceiling(prompts: list[str], seed: int) -> dict:
        """Rendered scenes of the prompts through the tokenizer and back: the best a model can score."""
        images = checker.rendered_like(prompts, seed + 10_000)
        return checker.scene_quality(tokenizer.decode(tokenizer.encode(images)).numpy(), prompts, seed)

    return parse, measure, ceiling
