"""How a model is trained: `python -m train --preset NAME --data TEXT --out RUN_DIR`.

The loop (`train.loop`), its hyperparameters, optimizer and schedule (`train.config`), the data
(`train.data`) and the run records it writes (`train.records`). Live diagnostics come from the
probes' own functions (`probes.entropy`, `probes.updates`), so training stands above `probes/`.
"""
