"""The Jacobi decoding loop: :func:`generate` (generate.py) runs one iteration (step.py: window, draft, q, forward,
verify, commit) on one of three schedules (eager.py, static.py, tree.py) over the per-row state
(state.py); validation.py checks every setting (the API's and the command line's one rule each)."""

from .generate import COUPLINGS, DEFAULT_COUPLING, DRAFT_INITS, MODES, GenerateOutput, generate

__all__ = ["COUPLINGS", "DEFAULT_COUPLING", "DRAFT_INITS", "MODES", "GenerateOutput", "generate"]
