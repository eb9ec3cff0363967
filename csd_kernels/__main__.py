"""``python -m csd_kernels ...`` is the ``csd`` command."""

import sys

from .cli import main

sys.exit(main())
