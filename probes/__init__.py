"""Probes: one module per diagnostic (attention entropy, degenerate attention, logit lens,
embedding neighbours, g/w/u update ratios, tuned lens, activation patching and head ablation, ...).

Each module has pure tensor functions, a model-level ``run(model, tokens, **options)``
runner and a ``main(argv=None)`` CLI for ``python -m probes.<name>``; see DESIGN.md.
"""
