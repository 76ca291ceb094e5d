"""The Monitor in a Hugging Face `Trainer` (train.monitor.hf): the rate a record holds is the one the
optimizer applied, and a guard judges every step's own loss, not the logging window's mean."""

from __future__ import annotations

import math

import pytest
import torch

from models.store.run import read_metrics

transformers = pytest.importorskip("transformers")


def examples(n: int = 48) -> list[dict[str, torch.Tensor]]:
    from test_monitor import CONFIG
    rows = torch.randint(0, CONFIG.vocab_size, (n, CONFIG.block_size), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": r, "labels": r} for r in rows]  # [pos] each; the model shifts its labels


def trainer_args(tmp_path, **options) -> transformers.TrainingArguments:
    settings = dict(output_dir=str(tmp_path / "hf"), use_cpu=True, report_to=[], per_device_train_batch_size=4,
                    learning_rate=1e-3, save_strategy="no", disable_tqdm=True, seed=0, logging_nan_inf_filter=False)
    return transformers.TrainingArguments(**{**settings, **options})


def test_a_record_holds_the_rate_the_optimizer_applied_not_the_schedules(tmp_path):
    """A hook that halves every group's rate around the optimizer's own step (as the guard's cap
    does): the records say the halved rate, the Trainer's log the schedule's."""
    from test_monitor import hf_gpt2
    from train.monitor import HFCallback

    model = hf_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    asked: list[float] = []

    def halve(opt, args, kwargs):
        asked[:] = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] = g["lr"] / 2

    def restore(opt, args, kwargs):
        for g, lr in zip(opt.param_groups, asked):
            g["lr"] = lr

    optimizer.register_step_pre_hook(halve)  # before the Monitor's hooks: what it reads is applied
    optimizer.register_step_post_hook(restore)
    callback = HFCallback(tmp_path / "run", log_every=2, report=False)
    trainer = transformers.Trainer(model=model, args=trainer_args(tmp_path, max_steps=6, logging_steps=2),
                                   train_dataset=examples(), callbacks=[callback], optimizers=(optimizer, None))
    trainer.train()
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    logged = {e["step"]: e for e in trainer.state.log_history if "learning_rate" in e}
    assert sorted(records) == sorted(logged) == [2, 4, 6]
    for step, entry in logged.items():  # the linear decay's rate of that step, and half of it applied
        assert entry["learning_rate"] > 0
        assert records[step]["lr"] == entry["learning_rate"] / 2  # halving a float is exact
        assert records[step]["train_loss"] == entry["loss"]  # the Trainer's own mean of its window


def test_the_guard_acts_on_a_nan_loss_inside_the_first_logging_window(tmp_path):
    """The weights turn NaN after step 3's update, once: step 4's loss is NaN. The Trainer logs every
    50 steps and the Monitor measures every 50: the guard still sees step 4's own loss and rescues
    there; the run ends finite, the Trainer's way (all 8 steps)."""
    from test_monitor import hf_gpt2
    from train.monitor import HFCallback

    class PoisonOnce(transformers.TrainerCallback):
        def on_optimizer_step(self, args, state, control, model=None, **kwargs):
            if state.global_step + 1 == 3:  # the step being taken is numbered global_step + 1
                with torch.no_grad():
                    model.transformer.wte.weight.fill_(math.nan)

    model = hf_gpt2()
    callback = HFCallback(tmp_path / "run", log_every=50, guard=True, report=False)
    trainer = transformers.Trainer(model=model, args=trainer_args(tmp_path, max_steps=8, logging_steps=50),
                                   train_dataset=examples(), callbacks=[callback, PoisonOnce()])
    trainer.train()
    rescued = [r for r in read_metrics(tmp_path / "run") if "rescue" in r]
    assert [r["step"] for r in rescued] == [4]  # the first step whose loss was NaN, not a log step
    assert rescued[0]["train_loss"] is None  # the step's own loss, NaN (written as null), not a window's mean
    assert trainer.state.global_step == 8
    assert all(torch.isfinite(p).all() for p in model.parameters())
