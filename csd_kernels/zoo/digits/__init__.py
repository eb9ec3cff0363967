"""A small real AR image model on scikit-learn's ``load_digits`` (8x8 digits -> 32x32 -> 16x16 VQ tokens).

* :mod:`.tokenizer` – ``PatchCodebook`` (2x2-patch k-means VQ, 512 codes) and ``digits_dataset``.
* :mod:`.model` – tiny LlamaGen-style class-conditional ``LlamaForCausalLM``; ``load_lm``,
  ``load_codebook``, ``prompt_ids``, ``sample_ar`` (reference AR sampler with CFG).
* :mod:`.quality` – classifier accuracy / Fréchet distance (CLIP-score / FID analogues).
* :mod:`.train` – ``python -m csd_kernels.zoo.digits.train --out DIR``.

Importing this package imports no torch (the command checks a digits prompt with :mod:`.prompts` before it
loads anything): the names below load from their module on first use.
"""

from ..._lazy import lazy_package

__all__ = ["CLASS_TOKEN_OFFSET", "DEFAULT_CFG", "GRID", "NULL_TOKEN_ID", "NUM_CLASSES", "NUM_CODES", "PROMPT_LEN",
           "VOCAB_SIZE", "WEIGHTS_DIR", "build_lm", "cfg_logits", "load_codebook", "load_lm", "prompt_ids",
           "sample_ar", "PatchCodebook", "digits_dataset", "to_uint8", "upsample"]
lazy_package(__name__, {
    **dict.fromkeys(("CLASS_TOKEN_OFFSET", "DEFAULT_CFG", "GRID", "NULL_TOKEN_ID", "NUM_CLASSES", "NUM_CODES",
                     "PROMPT_LEN", "VOCAB_SIZE", "WEIGHTS_DIR", "build_lm", "cfg_logits", "load_codebook", "load_lm",
                     "prompt_ids", "sample_ar"), ".model"),
    **dict.fromkeys(("PatchCodebook", "digits_dataset", "to_uint8", "upsample"), ".tokenizer"),
})
