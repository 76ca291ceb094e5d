"""`python -m train ...`: see `train.loop`."""

import sys

if __name__ == "__main__":  # --help and bad arguments answered before torch is imported (~4 s)
    from train.args import build_parser
    build_parser().parse_early()

from train.loop import main  # noqa: E402  (after the early answer on purpose)

if __name__ == "__main__":
    sys.exit(main())
