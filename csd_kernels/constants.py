"""Names and default values that several layers share, importable without torch (the ``csd`` command builds its
parser and refuses bad flags from them before it imports torch; config/generation.py reads them).

Each is defined here once; the layers that own the concept re-export it (reference.COUPLINGS,
reference.DEFAULT_ENTROPY_COEF, ops.registry.BACKENDS). The csd --model names and help are
models/registry.py's families (also torch-free) after the models shipped here, SHIPPED_MODELS, in the order of
registry.command_models()."""

__all__ = ["COUPLINGS", "DEFAULT_ENTROPY_COEF", "DEFAULT_TVD_THRESHOLD", "DEFAULT_GROUP_RANK", "DEFAULT_GROUP_DELTA",
           "SEED_LIMIT", "BACKENDS", "SHIPPED_MODELS"]

COUPLINGS = ("independent", "maximal", "gumbel")  # how positions after accept_len get their next draft
# CSD's λ (acceptance bonus per nat of entropy) and τ (the bonus applies where TVD(p, q) < τ): the CSD authors'
# reference code (github.com/aderfebr/CSD)
DEFAULT_ENTROPY_COEF = 0.5
DEFAULT_TVD_THRESHOLD = 0.65
# GSD's group (k, δ): tokens within ±k ranks of the draft whose probability is within δ of it (the CSD repository's
# k = 12, δ = 0.15)
DEFAULT_GROUP_RANK = 12
DEFAULT_GROUP_DELTA = 0.15
# a seed is a non-negative int64: an int in [0, 2^63) for ck.verify, ck.verify_tree, ck.generate (row b: seed + b
# below it) and the csd command alike
SEED_LIMIT = 1 << 63
BACKENDS = ("triton", "cuda", "cpu", "torch")  # verify backends; which can run where: ops.registry.backend_status
# the models the package ships (zoo/), first among csd --model's choices: {name: its line in the --model help}
SHIPPED_MODELS = {"digits": "the shipped digits model, weights in the package; prompts: class ids 0..9",
                  "scenes": "the shipped scenes model (576 tokens), weights in the package; prompts: e.g. "
                             "'red circle top-left; blue square center; on noise'"}
