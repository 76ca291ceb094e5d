"""The parts of the g / w / u report (`probes.updates`), also read by the doctor, the Monitor and the
app: per-parameter rows (`rows`), the report and its target band (`report`) and parameters grouped
by role (`groups`)."""
