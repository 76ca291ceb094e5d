"""The run doctor for anyone's training loop: a Monitor hooked on the optimizer writes an ordinary
run directory (run.json, metrics.jsonl) that `python -m probes.diagnose`, every CLI and the app read.

    from train.monitor import Monitor
    with Monitor(model, optimizer, "runs/my-run") as monitor:
        for step in range(max_iters):
            ...; loss.backward(); optimizer.step()
            monitor.log(step, train_loss=loss.item())

At log steps (every `log_every`) the optimizer's own step is measured through its step hooks: the
gradient norm and the g/w/u table (`probes.updates`) of exactly the update it made. Between log
steps the hooks only read the learning rate. At eval steps (every `eval_every`), given
`eval_tokens` [batch pos], the doctor's internal signals (attention entropy and max attention
logit per head, residual rms per layer, max |logit|, dead and saturated units) are measured on
our hooked twin of the model (`models.store.live`: ours, nanoGPT's `GPT`, Hugging Face GPT-2),
or, for any other model (nanochat, a Llama, a tutorial GPT), on the model itself through the
attention tap and forward hooks (`train.monitor.tap`).
Two `log` calls for one step make one record. `diagnose_every=N` prints each new finding of the
doctor once, while the run still lives; the diagnosis is printed when the Monitor closes.
Our own trainer (`python -m train`) logs through this class too. `guard=True` also acts: a run
whose loss blows up goes back to its last good state at a lower rate (`train.guard`, docs/guard.md).
"""

from __future__ import annotations

from typing import Any

from train.monitor.core import Monitor

__all__ = ["HFCallback", "Monitor"]


def __getattr__(name: str) -> Any:
    if name == "HFCallback":  # a TrainerCallback: imports transformers only when asked for
        from train.monitor.hf import HFCallback
        return HFCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
