"""The hf case of benchmarks/bench_guard.py: a transformers GPT-2 of the bench model's size (2
layers, 64-d, 2 heads, Tiny Shakespeare's characters, no dropout) in a Hugging Face `Trainer`
(its AdamW, linear decay, no warmup, batch 16 x 64, logging every 50 steps), in the arms that a
Trainer can take: none, lightning (its rule in a TrainerCallback, stopping the Trainer's way) and
the guard (`train.monitor.HFCallback(..., guard=True)`). PaLM's rewind and the skip-step rule act
inside the loop's step and are not run here.
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any

from guard_cases import BATCH, BLOCK, D_MODEL, HEADS, LAYERS, Case, Outcome, batch, val_loss, vocab, weights_hash

HF_ARMS = ("none", "lightning", "guard")
LOGGING_STEPS = 50


def gpt2(seed: int) -> Any:
    import torch
    import transformers
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab(), n_positions=BLOCK, n_embd=D_MODEL, n_layer=LAYERS,
                                     n_head=HEADS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def train_hf(case: Case, arm: str, seed: int, steps: int, options: dict[str, Any] | None = None) -> Outcome:
    """One Trainer run of `case` in `arm`; its Outcome (a guard's rescues read from its records)."""
    import torch
    import transformers

    from guard_arms import SpikeRule, eval_tokens, report_rescues
    from models.store.run import read_metrics
    from train.guard import Guard
    from train.monitor import HFCallback

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    t0 = time.perf_counter()
    model = gpt2(seed)
    rows = [x for step in range(steps) for x in batch(case, seed, step, steps)[0]]  # [block] each
    examples = [{"input_ids": r, "labels": r} for r in rows]  # the model shifts its labels
    out = Outcome(case, arm, seed, init_val=val_loss(model, case), final_val=math.nan)
    with tempfile.TemporaryDirectory() as tmp:
        args = transformers.TrainingArguments(
            output_dir=f"{tmp}/hf", use_cpu=True, report_to=[], max_steps=steps, logging_steps=LOGGING_STEPS,
            per_device_train_batch_size=BATCH, learning_rate=case.lr, save_strategy="no", disable_tqdm=True,
            seed=seed, data_seed=seed)
        callbacks: list[Any] = []
        rule = SpikeRule()
        if arm == "guard":
            settings = {k: v for k, v in (options or {}).items() if k != "via"}  # a Trainer's guard is the Monitor's
            callbacks.append(HFCallback(f"{tmp}/run", guard=Guard(**settings), report=False, eval_tokens=eval_tokens()))
        elif arm == "lightning":
            callbacks.append(StopOnSpike(rule))
        trainer = transformers.Trainer(model=model, args=args, train_dataset=examples, callbacks=callbacks)
        trainer.remove_callback(transformers.PrinterCallback)  # its log lines: the table says what counts
        trainer.train()
        if arm == "guard":
            report_rescues([r["rescue"] for r in read_metrics(f"{tmp}/run") if "rescue" in r], out)
    out.stopped |= rule.stopped
    out.seconds = time.perf_counter() - t0
    out.final_val = val_loss(model, case)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    out.rose = any(not math.isfinite(v) or v > min(losses[:i + 1]) + 1.0 for i, v in enumerate(losses))
    out.weights = weights_hash(model)
    return out


class StopOnSpike:
    """Lightning's rule on each step's loss (the model's own, from a forward hook), stopping the Trainer."""

    def __new__(cls, rule: Any) -> Any:
        import transformers

        class Callback(transformers.TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kwargs):
                self.loss = None

                def keep(module, inputs, output):
                    if module.training and getattr(output, "loss", None) is not None:
                        self.loss = float(output.loss.detach())
                self.handle = model.register_forward_hook(keep)

            def on_step_end(self, args, state, control, **kwargs):
                if self.loss is not None and rule.spike(state.global_step, self.loss):
                    control.should_training_stop = True

            def on_train_end(self, args, state, control, **kwargs):
                self.handle.remove()

        return Callback()
