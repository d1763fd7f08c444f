"""`python -m lamina` runs the command line."""

import sys

from lamina.cli import main

if __name__ == "__main__":
    sys.exit(main())
