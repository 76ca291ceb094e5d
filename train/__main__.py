"""`python -m train ...`: see `train.loop`."""

import sys

from train.loop import main

if __name__ == "__main__":
    sys.exit(main())
