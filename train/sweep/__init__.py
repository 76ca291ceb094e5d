"""Learning-rate sweeps, `python -m train.sweep` (docs/training.md): one ordinary run per grid point.

The parts, one idea each: `cli` (the flags, the sweep's driver, `main`), `grid` (the rates x
variants and each point's `python -m train` command), `book` (sweep.json: the grid, each run's
outcome, the LR sensitivities), `local` (runs as local processes, the default) and `on_ray` (runs as
Ray tasks, `--backend ray`). Nothing is imported here: `python -m train.sweep --help` answers
before anything heavy is loaded.
"""
