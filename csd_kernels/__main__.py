"""``python -m csd_kernels ...`` is the ``csd`` command."""

import sys

from .cli.entry import main

sys.exit(main())
