"""``python -m loadgen`` is ``prism-loadgen``."""

import sys

from loadgen.cli import main

sys.exit(main())
