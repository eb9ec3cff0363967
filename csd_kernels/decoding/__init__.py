"""The Jacobi decoding loop: :func:`generate` (generate.py) runs one iteration (step.py: window, draft, q, forward,
verify, commit) on one of three schedules (eager.py, static.py, tree.py) over the per-row state (state.py);
validation.py checks the inputs against the settings of :mod:`csd_kernels.config` (:class:`GenerationConfig`).

Importing this package imports no torch: generate and GenerateOutput load generate.py on first use."""

from .._lazy import lazy_package
from ..config.generation import DEFAULT_COUPLING, DRAFT_INITS, MODES, GenerationConfig
from ..constants import COUPLINGS

__all__ = ["COUPLINGS", "DEFAULT_COUPLING", "DRAFT_INITS", "MODES", "GenerateOutput", "GenerationConfig", "generate"]
lazy_package(__name__, {"GenerateOutput": ".generate", "generate": ".generate"})
