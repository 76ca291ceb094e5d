"""Training moved to its own package: `python -m train` (models/ no longer trains).

Kept so that the old command says where to go instead of failing with 'No module named'.
"""

import sys

MOVED = ("error: training moved out of models/: run `python -m train` with the same arguments "
         "(e.g. python -m train --preset transformer4_rms_small --data TEXT --out runs/x)")


def main(argv: list[str] | None = None) -> int:
    print(MOVED, file=sys.stderr)
    return 2


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
