"""`python -m prism_sim`."""

import sys

from prism_sim.cli import main

sys.exit(main())
