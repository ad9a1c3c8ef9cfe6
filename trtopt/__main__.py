"""`python -m trtopt ...`: the `trtopt` command, for environments whose scripts directory is not on PATH."""

import sys

from trtopt.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
