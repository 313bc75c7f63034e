"""`python -m epiforge ...`: the command line (epiforge/cli.py)."""

import sys

from epiforge.cli import main

sys.exit(main())
