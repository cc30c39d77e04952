"""`python -m prism_proxy` = `prism-proxy`."""

import sys

from prism_proxy.cli import main

sys.exit(main())
