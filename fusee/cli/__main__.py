"""``python -m fusee.cli``: the ``fusee`` command."""

import sys

from fusee.cli import main

sys.exit(main())
