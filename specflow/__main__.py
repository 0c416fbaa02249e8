"""`python -m specflow [command] [hydra overrides]`: see `specflow.cli`."""

import sys

from specflow.cli import main

if __name__ == "__main__":
    sys.exit(main())
