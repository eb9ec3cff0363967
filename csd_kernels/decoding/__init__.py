"""The Jacobi decoding loop: :func:`generate` (generate.py) strings together the steps (steps.py) over the per-row
state (state.py)."""

from .generate import COUPLINGS, DEFAULT_COUPLING, DRAFT_INITS, MODES, GenerateOutput, generate

__all__ = ["COUPLINGS", "DEFAULT_COUPLING", "DRAFT_INITS", "MODES", "GenerateOutput", "generate"]
