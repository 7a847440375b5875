"""`python -m ablate.train`: one trial, then out without the interpreter's teardown."""

import os
import sys

from ablate import store
from ablate.train.cli import main

code = main()
store.close_engines()
sys.stdout.flush()
sys.stderr.flush()
# the interpreter's teardown (unloading torch and the rest: ~0.8 CPU-s a trial) does nothing a trainer needs:
# its rows are written, its files and engines closed; it leaves as a child of the warm helper does
os._exit(code)
