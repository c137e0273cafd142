"""`python -m rlfleet`: the `rlfleet` command, for environments whose scripts folder is not on PATH."""

import sys

from rlfleet.cli import main

if __name__ == "__main__":  # spawned worker processes import this module too: only the command runs main
    sys.exit(main())
