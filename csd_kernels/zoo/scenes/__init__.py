"""A Janus-sized test-bed that ships with the package: colour scenes of 24x24 = 576 tokens from a 4096-code tokenizer,
prompted by attributes, with an exact pixel-level measure of prompt adherence.

* :mod:`.world` – the procedural world (render a scene from a seed) and the prompt grammar.
* :mod:`.checker` – adherence from pixels alone, background kind, a Fréchet distance to rendered scenes.
* :mod:`.tokenizer` – 4x4-patch k-means tokenizer (4096 codes).
* :mod:`.model` – the prompt tokens and the LlamaGen-style GPT (a small ``LlamaForCausalLM``).
* :mod:`.train` – ``python -m csd_kernels.zoo.scenes.train --out DIR`` (resumable).
"""

from .world import BACKGROUNDS, CELLS, COLOURS, SHAPES, parse_prompt, random_prompts, render  # noqa: F401

DEFAULT_CFG = 3.0  # chosen by AR adherence over cfg (README of this model)

__all__ = ["BACKGROUNDS", "CELLS", "COLOURS", "SHAPES", "DEFAULT_CFG", "parse_prompt", "random_prompts", "render",
           "zoo_model"]


def zoo_model(device=None):
    """The shipped scenes model as a :class:`csd_kernels.zoo.ZooModel` (adapter, prompt parser, defaults, quality)."""
    from ...models import ImageGPT
    from .. import ZooModel
    from . import checker
    from .model import NULL_TOKEN_ID, NUM_CODES, load_lm, load_tokenizer, prompt_ids
    from .tokenizer import GRID

    tokenizer = load_tokenizer()
    lm = load_lm() if device is None else load_lm().to(device)
    model = ImageGPT(lm, image_token_range=(0, NUM_CODES), grid=GRID, null_token_id=NULL_TOKEN_ID,
                     decode=lambda tokens: tokenizer.decode(tokens.cpu()))

    def parse(prompts: list[str]) -> dict:
        ids = prompt_ids(list(prompts))
        return {"input_ids": ids if device is None else ids.to(device)}

    def measure(tokens, prompts: list[str]) -> dict:
        return checker.scene_quality(tokenizer.decode(tokens.cpu()).numpy(), prompts)

    def ceiling(prompts: list[str], seed: int) -> dict:
        """Rendered scenes of the prompts through the tokenizer and back: the best a model can score."""
        images = checker.rendered_like(prompts, seed + 10_000)
        return checker.scene_quality(tokenizer.decode(tokenizer.encode(images)).numpy(), prompts, seed)

    return ZooModel("scenes", model, parse, defaults=dict(cfg_scale=DEFAULT_CFG), quality=measure,
                    heldout_quality=ceiling,
                    prompt_help="objects 'COLOUR SHAPE CELL' separated by ';' and an optional 'on flat|gradient|noise'")
