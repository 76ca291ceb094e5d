"""The run doctor: history readers, rules, thresholds, findings (torch-free)."""
