"""Per-row readings of attention patterns that the entropy, degenerate and heads probes reduce inside
their hooks: the head-type rows (`head_types`), rows rebuilt blockwise from q and k without a
[batch head n n] pattern (`qk`), and the per-head sums over them (`stats`)."""
