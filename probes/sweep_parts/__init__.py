"""The parts of `probes.sweep`, also read by `train.sweep` and the app: sweep.json checked field by
field (`file`) and each run's divergence and the LR sensitivity (`stats`)."""
