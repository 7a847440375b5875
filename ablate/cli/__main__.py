"""`python -m ablate.cli`: the `ablate` program."""

import sys

from ablate.cli import main

sys.exit(main())
