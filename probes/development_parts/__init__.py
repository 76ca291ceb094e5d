"""The parts of the development view (`probes.development`): each snapshot's cached reading
(`cache`), the text every snapshot is read on (`inputs`), the phase changes between snapshots
(`phase_changes`, also read by the doctor) and their heads ablated (`phase_ablation`, also what
`probes.heads --confirm` runs)."""
