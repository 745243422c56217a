"""``python -m goinfer ...``: the same as the ``goinfer`` command."""

import sys

from goinfer.cli import main

sys.exit(main())
