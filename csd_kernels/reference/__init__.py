"""The maths of CSD verification, written once.

Every backend (Triton, C++/CPU, CUDA) and every test is held against the functions of this package. They are plain,
vectorised PyTorch (no Python loop over rows or positions) and take a ``compute_dtype`` so tests can run them in
float64. The ``torch`` backend *is* :func:`verify` with ``compute_dtype=torch.float32``. Modules: :mod:`.rng` (the
random numbers), :mod:`.distributions` (p, q and the per-position statistics), :mod:`.verify` (the step),
:mod:`.rules` (the acceptance rules: a(x), the resampling law, the distortion), :mod:`.tree` (draft trees); every public
name is here too.

Definitions (per row b and window position i; V = vocabulary size):

* target distribution   z = (u + s·(c − u)) · (1/T)   (c, u: conditional / unconditional logits, s: CFG scale);
                        z_v = −inf where c_v or u_v is −inf (a masked token: p_v = 0, never NaN).
                        p = softmax(z), restricted to the support S = {v : z_v finite} ∩ top-k ∩ top-p ∩ min-p:
                        top_k: z_v ≥ k-th largest finite z (ties kept); top_p: z_v ≥ z_(j) where z_(1) ≥ z_(2) ≥ …
                        are the kept z sorted and j the first index whose cumulative softmax mass reaches
                        top_p·total (ties kept); min_p: z_v − max z ≥ float32(ln min_p), i.e. p_v ≥ min_p·max p.
                        T = 0 means greedy: p = one-hot(argmax z) (lowest index on ties), S = {argmax}.
                        target_probs w instead of logits: p = w / Σw (rows within PROB_SUM_TOLERANCE of 1),
                        S = {v : w_v > 0}, z = ln w (for the gumbel coupling).
* entropy               H = −Σ p ln p  (nats, 0 ln 0 = 0)
* total variation       TVD = ½ Σ |p − q|        (q = draft_probs row, or one-hot(x) when draft_probs is None,
                                                  or the zero vector when there is neither: TVD = ½)
* acceptance of draft x by the rule (strict, csd, gsd, arsample, lantern, lantern++: :mod:`.rules`), e.g.
                        strict: a(x) = min(1, p(x)/q(x));  csd: a(x) = min(1, p(x)/q(x) + λ·H) if TVD < τ else strict;
                        a(x) = 0 when q(x) = 0 (invalid draft for that position: rejected, never divided by zero)
                        and when x ∉ S (a masked or filtered draft is always rejected, whatever the rule)
* decision              accept iff u_accept < a(x)
* resampling            r ∝ max(p − q·a, 0), which is max(p − q, 0) for every rule but gsd; p when it sums to zero
* output distribution   out(y) = q(y)a(y) + (1 − Σ q a) r(y);   distortion = ½ Σ |out − p| = Σ_y max(q a − p, 0)
                        (0 for strict; :func:`closed_form_distortion`)
* next drafts           positions after accept_len get a new draft, marginally ~ p:
                        independent: inverse-CDF draw from p;  maximal: keep x iff u_accept < min(1, p(x)/q(x)),
                        else draw from the residual;  gumbel: argmax(z + G), G fixed per (seed, row, absolute position).

Random numbers: see :mod:`.rng`.
"""

from .distributions import *  # noqa: F401,F403
from .distributions import __all__ as _distributions
from .rng import *  # noqa: F401,F403
from .rng import __all__ as _rng
from .rules import *  # noqa: F401,F403
from .rules import __all__ as _rules
from .tree import *  # noqa: F401,F403
from .tree import __all__ as _tree
from .verify import *  # noqa: F401,F403
from .verify import __all__ as _verify

__all__ = [*_rng, *_distributions, *_rules, *_verify, *_tree]
