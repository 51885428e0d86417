"""``python -m gate``: the same command line as the ``gate`` console script."""

import sys

from gate.cli import main

if __name__ == "__main__":
    sys.exit(main())
