"""``python -m mvsink.cli``: the ``mvsink`` command."""

import sys

from mvsink.cli.main import main

sys.exit(main())
