"""`python -m train ...`: see `train.loop`."""

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from train.args import build_parser
    build_parser().parse_early()


from train.loop import main  # noqa: E402  (after the early answer on purpose)

if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
