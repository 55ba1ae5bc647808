"""``python -m perf.chaos`` is ``python -m perf chaos``."""

import sys

from perf.cli import main

sys.exit(main(["chaos", *sys.argv[1:]]))
