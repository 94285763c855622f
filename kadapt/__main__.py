"""`python -m kadapt ...` runs the `kadapt` command."""

import sys

from kadapt.cli import main

sys.exit(main())
