"""`python -m probes.patching`: --help and bad arguments are answered before torch is imported."""

from probes.patching_args import patching_parser

patching_parser().parse_early()

from models.cli import exit_entry  # noqa: E402
from probes.patching.cli import main  # noqa: E402

exit_entry(main())
