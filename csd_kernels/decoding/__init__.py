"""The Jacobi decoding loop: :func:`generate` (generate.py) strings together the steps (steps.py) over the per-row
state (state.py); static.py is the fixed-shape loop, tree.py its draft-tree form; validation.py checks every setting
(the API's and the command line's one rule each)."""

from .generate import COUPLINGS, DEFAULT_COUPLING, DRAFT_INITS, MODES, GenerateOutput, generate

__all__ = ["COUPLINGS", "DEFAULT_COUPLING", "DRAFT_INITS", "MODES", "GenerateOutput", "generate"]
