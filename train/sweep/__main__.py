"""`python -m train.sweep ...`: see `train.sweep.cli`."""

from models.interrupts import quiet_signals

quiet_signals()  # Ctrl-C/SIGTERM: one line from here on, the imports below included (see models.interrupts)

from models.cli import exit_entry  # noqa: E402  (after the signals on purpose)
from train.sweep.cli import main  # noqa: E402

exit_entry(main())
