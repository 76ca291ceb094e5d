"""The lens's parts, shared by `probes.logit_lens`, `probes.tuned_lens`, a saved snapshot's source and
the app: the result and its per-layer statistics (`result`, `stats`) and the tuned lens's files
beside a snapshot (`tuned_file`)."""
