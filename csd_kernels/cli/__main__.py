"""``python -m csd_kernels.cli ...`` is the ``csd`` command."""

import sys

from .entry import main

sys.exit(main())
