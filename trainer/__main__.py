"""`python -m trainer ...`: see trainer/cli.py."""

import sys

from trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
