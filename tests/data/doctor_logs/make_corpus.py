"""Writes the doctor's corpus of foreign logs (tests/test_doctor_real_*.py read them), each with the
library that writes such logs for real where it is installed here:

- hf_*: transformers.Trainer itself, training a tiny GPT-2 (1 layer, built from a config: no
  download) on CPU, then `trainer.save_state()` and the model's config.json (no weights);
  hf_fp16_skip's skipped step is forced: a gradient hook makes one step's gradients inf and the
  optimizer skips that step the way torch.amp.GradScaler does (its CPU build does not scale fp16).
- trl_*, hf_*_state: a TrainerState with the keys TRL's trainers log, saved by TrainerState.save_to_json.
- lightning_tb, regression_tb: torch.utils.tensorboard.SummaryWriter with Lightning's default tag names.
- llmc_*: lines in the printf formats of karpathy/llm.c's train_gpt2.cu, train_gpt2.c, llmc/logger.h.
- nanogpt_*: lines in the f-string formats of karpathy/nanoGPT's train.py.
- lfs_pointer: a Git LFS pointer file named as an event file.

Run from the repository root: .venv/bin/python tests/data/doctor_logs/make_corpus.py
The truth of each (read by hand from its curve) is in tests/test_doctor_real_corpus.py.
"""

from __future__ import annotations

import math
import random
import shutil
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------ the real Trainer

class Tokens(torch.utils.data.Dataset):
    def __init__(self, rows: torch.Tensor):
        self.rows = rows  # [n seq]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class SkippingAdamW(torch.optim.AdamW):
    """AdamW that skips a step whose gradients are not finite, as GradScaler.step does."""

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not all(torch.isfinite(g).all() for g in grads):
            return None
        return super().step(closure)


def pattern_rows(n: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """Counting sequences (start, start+1, ...) mod vocab: learnable."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, vocab, (n, 1), generator=g)
    return (starts + torch.arange(seq)) % vocab  # [n seq]


def random_rows(n: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, seq), generator=g)  # [n seq]


def trainer_run(name: str, *, vocab: int, lr: float, steps: int, train: torch.Tensor, evals: torch.Tensor | None,
                eval_steps: int = 0, schedule: str = "constant", inf_at: int | None = None, n_embd: int = 16,
                n_layer: int = 1) -> None:
    import transformers
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    transformers.set_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=32, n_embd=n_embd, n_layer=n_layer, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    if inf_at is not None:
        calls = {"n": 0}

        def poison(grad: torch.Tensor) -> torch.Tensor:  # the gradient of the inf_at-th backward pass
            calls["n"] += 1
            return torch.full_like(grad, math.inf) if calls["n"] == inf_at else grad
        model.transformer.wte.weight.register_hook(poison)
    args = transformers.TrainingArguments(
        output_dir=str(out / "tmp"), max_steps=steps, learning_rate=lr, lr_scheduler_type=schedule,
        per_device_train_batch_size=4, per_device_eval_batch_size=8, logging_steps=1,
        eval_strategy="steps" if evals is not None else "no", eval_steps=eval_steps or None,
        save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True, weight_decay=0.0)
    optimizer = SkippingAdamW(model.parameters(), lr=lr, weight_decay=0.0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(train),
                                   eval_dataset=Tokens(evals) if evals is not None else None,
                                   optimizers=(optimizer, None))
    trainer.train()
    trainer.args.output_dir = str(out)
    trainer.save_state()
    config.to_json_file(str(out / "config.json"))
    shutil.rmtree(out / "tmp", ignore_errors=True)


def trainer_runs() -> None:
    trainer_run("hf_fp16_skip", vocab=64, lr=3e-3, steps=60, train=pattern_rows(64, 32, 64, 0), evals=None,
                inf_at=25)
    trainer_run("hf_lr5", vocab=64, lr=5.0, steps=60, train=pattern_rows(64, 32, 64, 0), evals=None)
    trainer_run("hf_uniform", vocab=50257, lr=1e-9, steps=40, train=random_rows(64, 32, 50257, 0), evals=None)
    trainer_run("hf_overfit", vocab=64, lr=3e-3, steps=400, train=random_rows(16, 32, 64, 1),
                evals=random_rows(16, 32, 64, 2), eval_steps=50, n_embd=64, n_layer=2)
    trainer_run("hf_decayed", vocab=64, lr=3e-3, steps=300, train=pattern_rows(64, 32, 64, 0), evals=None,
                schedule="linear")
    trainer_run("hf_short", vocab=64, lr=3e-3, steps=4, train=pattern_rows(64, 32, 64, 0), evals=None)


# ------------------------------------------------------------------ TRL's keys, by TrainerState

def save_state(name: str, log_history: list[dict], max_steps: int) -> None:
    import transformers
    out = HERE / name
    out.mkdir(exist_ok=True)
    state = transformers.TrainerState(max_steps=max_steps, global_step=max_steps, logging_steps=10,
                                      log_history=log_history)
    state.save_to_json(str(out / "trainer_state.json"))


def trl_states() -> None:
    rng = random.Random(0)
    dpo = []  # DPO: loss from ln 2 falling as the chosen/rejected margin grows, then flat at ~0.45
    for step in range(10, 401, 10):
        margin = 0.8 * (1 - math.exp(-step / 80)) + rng.gauss(0, 0.03)
        loss = math.log1p(math.exp(-margin))
        dpo.append({"loss": loss, "grad_norm": 5 + rng.random(), "learning_rate": 5e-7,
                    "rewards/chosen": margin / 2, "rewards/rejected": -margin / 2,
                    "rewards/accuracies": 0.5 + margin / 2,
                    "rewards/margins": margin, "logps/chosen": -300.0, "logps/rejected": -310.0, "epoch": step / 400,
                    "step": step})
    save_state("trl_dpo", dpo, 400)
    grpo = []  # GRPO: loss ~0 either sign, reward rising, kl growing from 0
    for step in range(10, 301, 10):
        grpo.append({"loss": rng.gauss(0, 0.002) + 1e-3 * step / 300, "grad_norm": 0.3 + 0.1 * rng.random(),
                     "learning_rate": 1e-6, "reward": 0.2 + 0.5 * step / 300 + rng.gauss(0, 0.03),
                     "reward_std": 0.3, "kl": 0.004 * step / 10, "completion_length": 120.0,
                     "epoch": step / 300, "step": step})
    save_state("trl_grpo", grpo, 300)
    cls = []  # a classifier: loss falls to ~1e-4, its median grad norm to ~1e-3, ordinary norms of ~3
    for step in range(2, 801, 2):
        loss = max(0.69 * math.exp(-step / 60), 1e-4) * math.exp(rng.gauss(0, 0.3))
        norm = max(2.0 * math.exp(-step / 60), 1e-3) * math.exp(rng.gauss(0, 0.5))
        if step > 300 and rng.random() < 0.08:
            norm = 3.0 * math.exp(rng.gauss(0, 0.3))  # a batch the model still gets wrong: ordinary
        cls.append({"loss": float(f"{loss:.3g}"), "grad_norm": float(f"{norm:.3g}"), "learning_rate": 2e-5,
                    "step": step})
    save_state("hf_classifier", cls, 800)


# ------------------------------------------------------------------ TensorBoard

def tensorboard_logs() -> None:
    from torch.utils.tensorboard import SummaryWriter
    rng = random.Random(1)
    folder = HERE / "lightning_tb" / "lightning_logs" / "version_0"
    shutil.rmtree(HERE / "lightning_tb", ignore_errors=True)
    w = SummaryWriter(str(folder))  # what self.log(..., on_step=True, on_epoch=True) names and writes
    step, per_epoch = 0, 25
    for epoch in range(8):
        losses = []
        for _ in range(per_epoch):
            loss = 1.6 + 2.6 * math.exp(-step / 50) + rng.gauss(0, 0.05)
            losses.append(loss)
            if step % 5 == 4:  # Trainer(log_every_n_steps=5)
                w.add_scalar("train_loss_step", loss, step)
                w.add_scalar("lr-AdamW", 1e-3, step)
                w.add_scalar("epoch", epoch, step)
            step += 1
        w.add_scalar("val_loss", 1.65 + 2.6 * math.exp(-step / 50), step - 1)
        w.add_scalar("train_loss_epoch", sum(losses) / len(losses), step - 1)
        w.add_scalar("epoch", epoch, step - 1)
    w.add_scalar("hp_metric", -1, 0)
    w.close()
    shutil.rmtree(HERE / "regression_tb", ignore_errors=True)
    w = SummaryWriter(str(HERE / "regression_tb"))  # a regression: mean-squared error in the thousands
    for step in range(0, 500, 5):
        w.add_scalar("train/loss", 4000 * math.exp(-step / 100) + 150 + rng.gauss(0, 20), step)
        if step % 50 == 0:
            w.add_scalar("val/loss", 4000 * math.exp(-step / 100) + 180, step)
    w.close()
    lfs = HERE / "lfs_pointer"
    lfs.mkdir(exist_ok=True)
    (lfs / "events.out.tfevents.1700000000.host.1.0").write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 88342\n")


# ------------------------------------------------------------------ printed logs

def llmc_logs() -> None:
    rng = random.Random(2)
    lines = ["+-----------------------+----------------------------------------------------+",
             "| learning rate (LR)    | 6.000000e-04                                       |",
             "| max_steps             | 20                                                 |",
             "| vocab_size V          | 50257                                              |",
             "| padded_vocab_size Vp  | 50304                                              |"]
    for step in range(20):  # NaN from the first step: what a real one printed
        if step % 10 == 0:
            lines.append("val loss nan")
        lines.append(f"step {step + 1:4d}/20 | loss {math.nan:7.6f} ({math.nan:+.2f}z)| norm {math.nan:6.4f} "
                     f"({math.nan:+.2f}z)| lr {6e-4 * (step + 1) / 20:.2e} | {95.3 + rng.random():.2f} ms | "
                     f"40.1% bf16 MFU | {171000 + rng.randint(0, 999):.0f} tok/s")
    lines.append("val loss nan")
    (HERE / "llmc_nan.log").write_text("\n".join(lines) + "\n")
    main = []  # llmc/logger.h: a healthy GPT-2 124M-like curve, val every 250 steps
    for step in range(0, 2001, 50):
        if step % 250 == 0:
            main.append(f"s:{step} tel:{3.3 + 7.7 * math.exp(-step / 150):.4f}")
        if step < 2000:
            lr = 6e-4 * min(1.0, (step + 1) / 700)
            main.append(f"s:{step} trl:{3.28 + 7.7 * math.exp(-step / 150) + rng.gauss(0, 0.03):.4f} "
                        f"lr:{lr:.6f} norm:{0.4 + 2 * math.exp(-step / 100) + 0.05 * rng.random():.2f}")
    out = HERE / "llmc_out"
    out.mkdir(exist_ok=True)
    (out / "main.log").write_text("\n".join(main) + "\n")
    c = ["[GPT-2]", "max_seq_len: 1024", "vocab_size: 50257", "padded_vocab_size: 50304"]
    for step in range(41):  # train_gpt2.c's 40 steps on tiny shakespeare from the GPT-2 weights
        if step % 10 == 0:
            c.append(f"val loss {4.1 + 1.2 * math.exp(-step / 8):f}")
        if step < 40:
            c.append(f"step {step}: train loss {3.9 + 1.4 * math.exp(-step / 8) + rng.gauss(0, 0.05):f} "
                     f"(took {1400 + rng.random() * 100:f} ms)")
    (HERE / "llmc_gpt2c.log").write_text("\n".join(c) + "\n")


def nanogpt_logs() -> None:
    """shakespeare_char overfitting: val best at 2000, then rising, with always_save_checkpoint = False."""
    lines = ["Overriding config with config/train_shakespeare_char.py:", "always_save_checkpoint = False",
             "max_iters = 5000", "learning_rate = 1e-3", "log_interval = 50", "tokens per iteration will be: 16,384",
             "found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)"]
    rng = random.Random(3)
    for it in range(0, 5001, 50):
        train = 0.8 + 3.4 * math.exp(-it / 400) - 0.08 * it / 1000
        val = 1.47 + 2.7 * math.exp(-it / 400) + 0.00000004 * max(0, it - 2000) ** 2
        if it % 250 == 0:
            lines.append(f"step {it}: train loss {train:.4f}, val loss {val:.4f}")
            if it >= 250 and val <= 1.48 + 2.7 * math.exp(-it / 400):
                lines.append("saving checkpoint to out-shakespeare-char")
        lines.append(f"iter {it}: loss {train + rng.gauss(0, 0.03):.4f}, time {31.5 + rng.random():.2f}ms, "
                     f"mfu {6.1 if it else -100.0:.2f}%")
    (HERE / "nanogpt_overfit.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    parts = {"trainer": trainer_runs, "trl": trl_states, "tb": tensorboard_logs, "llmc": llmc_logs,
             "nanogpt": nanogpt_logs}
    for name in sys.argv[1:] or parts:
        parts[name]()
