"""Each rule changed for issue 36 (the doctor on the logs people really have), on the case that
motivated it, with numbers chosen on paper: a skipped step, a loss that explodes without NaN, a
loss stuck at ln(vocab), a run too short to judge, plateaus on the wrong runs, advice from what
the log holds, spikes against a collapsed median."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from probes import diagnose
from tests.test_diagnose import write_run

transformers = pytest.importorskip("transformers")


def codes(d: diagnose.Diagnosis) -> dict[str, str]:
    return {f.code: f.severity for f in d.findings}


def found(d: diagnose.Diagnosis, code: str) -> diagnose.Finding:
    return next(f for f in d.findings if f.code == code)


def trainer_state(folder: Path, entries: list[dict], max_steps: int, vocab: int | None = None) -> Path:
    """trainer_state.json as transformers' TrainerState writes it, with a GPT-2 config.json beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    transformers.TrainerState(max_steps=max_steps, global_step=max_steps, logging_steps=1,
                              log_history=entries).save_to_json(str(folder / "trainer_state.json"))
    if vocab:
        transformers.GPT2Config(vocab_size=vocab, n_positions=32, n_embd=8, n_layer=1, n_head=1).to_json_file(
            str(folder / "config.json"))
    return folder


# ------------------------------------------------------------------ 1. a skipped step is not a divergence

def test_one_inf_grad_norm_between_finite_ones_is_a_skipped_step(tmp_path):
    norms = [0.9, 0.85, 0.8, 0.76, math.inf, 0.63, 0.6, 0.6, 0.58, 0.57]
    entries = [{"loss": 0.34 - 0.02 * i, "grad_norm": n, "learning_rate": 2e-5, "step": i + 1}
               for i, n in enumerate(norms)]
    d = diagnose.run(trainer_state(tmp_path / "skip", entries, 10))
    assert d.verdict == "healthy" and codes(d) == {"skipped_steps": "info"}
    assert found(d, "skipped_steps").step == 5
    stays = [dict(e, grad_norm=math.inf) if e["step"] >= 5 else e for e in entries]  # never finite again
    assert codes(diagnose.run(trainer_state(tmp_path / "stays", stays, 10)))["divergence"] == "failed"
    nan_loss = [dict(e, loss=math.nan) if e["step"] == 5 else e for e in entries]  # the loss went too
    assert codes(diagnose.run(trainer_state(tmp_path / "loss", nan_loss, 10)))["divergence"] == "failed"


# ------------------------------------------------------------------ 2. an explosion without NaN fails

def test_a_loss_that_ends_far_above_its_start_failed_with_no_planned_steps(tmp_path):
    """A user's GPT at AdamW lr 10 under a Monitor that was not told --steps: 4.3 -> 4433 -> 313."""
    vals = [4.3, 4433.0, 2100.0, 900.0, 313.0]
    run = write_run(tmp_path / "lr10", [{"step": 100 * i, "val_loss": v} for i, v in enumerate(vals)],
                    train={"steps": None, "lr": 10.0})
    div = found(diagnose.run(run), "divergence")
    assert div.severity == "failed" and "above its first value 4.30" in div.title and "(it is 10;" in div.fix


def test_a_run_that_ends_above_ln_vocab_failed_though_below_its_first_loss(tmp_path):
    run = write_run(tmp_path / "v", [{"step": 10 * i, "train_loss": v} for i, v in enumerate([6.0, 3.0, 2.5, 4.9])])
    div = found(diagnose.run(run), "divergence")  # d_vocab 65: ln 65 = 4.17 < 4.9 < 6.0
    assert div.severity == "failed" and "above ln(65) = 4.17" in div.title


# ------------------------------------------------------------------ 4. stuck at uniform

def test_a_loss_at_ln_vocab_over_the_whole_run_failed(tmp_path):
    entries = [{"loss": 10.78 - 0.01 * i / 19, "learning_rate": 0.0, "grad_norm": 0.5, "step": 10 * (i + 1)}
               for i in range(20)]
    d = diagnose.run(trainer_state(tmp_path / "u", entries, 200, vocab=50257))
    assert d.verdict == "failed" and codes(d)["uniform_loss"] == "failed"
    assert found(d, "uniform_loss").evidence["ln_vocab"] == pytest.approx(math.log(50257))
    learning = [dict(e, loss=10.78 - 0.3 * i) for i, e in enumerate(entries)]
    assert "uniform_loss" not in codes(diagnose.run(trainer_state(tmp_path / "l", learning, 200, vocab=50257)))


# ------------------------------------------------------------------ 5. too short to judge

def test_a_run_of_six_points_is_too_short_and_says_what_it_could_not_check(tmp_path):
    d = diagnose.run(write_run(tmp_path / "s", [{"step": s, "train_loss": 4.0 - s / 10} for s in range(1, 7)]))
    assert d.verdict == "too short" and "too short to judge: 6 logged losses" in d.format()
    assert d.not_checked["plateau"].startswith("not enough data")
    three = [{"step": 0, "val_loss": 9.0}, {"step": 1, "train_loss": 8.0}, {"step": 2, "train_loss": 7.5}]
    warned = diagnose.run(write_run(tmp_path / "w", three))
    assert warned.verdict == "warning"  # a finding above info still speaks (init_loss_high: 9 vs ln 65)


# ------------------------------------------------------------------ 3. plateaus

def test_an_overfit_run_whose_first_eval_was_its_best_gets_no_plateau(tmp_path):
    records = [{"step": s, "train_loss": 0.89 * math.exp(-s / 60) + 2e-4, "val_loss": 0.9 + s / 1000}
               for s in range(50, 1001, 50)]
    d = diagnose.run(write_run(tmp_path / "o", records))
    assert "overfitting" in codes(d) and "plateau" not in codes(d)


def test_losses_that_are_not_cross_entropies_are_judged_scale_free_or_not_at_all(tmp_path):
    grpo = [{"loss": 1e-4 * ((-1) ** i), "reward": 0.2 + i / 100, "kl": i / 1000, "step": 10 * (i + 1)}
            for i in range(30)]
    d = diagnose.run(trainer_state(tmp_path / "grpo", grpo, 300))
    assert d.verdict == "healthy" and "plateau" in d.not_checked and "policy-gradient" in d.not_checked["plateau"]
    mse = [{"loss": 4000 * math.exp(-i / 10) + 150 + (20 if i % 2 else -20), "step": 10 * (i + 1)} for i in range(50)]
    d = diagnose.run(trainer_state(tmp_path / "mse", mse, 500))
    assert "divergence" not in codes(d)  # a noise of 40 is no 40-nat rise
    dpo = [{"loss": 0.693, "rewards/chosen": 0.0, "rewards/rejected": 0.0, "step": 10 * (i + 1)} for i in range(30)]
    flat = found(diagnose.run(trainer_state(tmp_path / "dpo", dpo, 300)), "plateau")
    assert flat.severity == "warning" and "of its first value" in flat.title  # stuck at ln 2, said scale-free


def test_no_plateau_on_a_six_step_stretch_nor_from_one_lucky_batch(tmp_path):
    # a 60-step run flat over its last 10 steps: a tenth of it, but no twenty steps
    short = [{"step": s, "train_loss": 3.0 - s / 100 if s < 50 else 2.5} for s in range(60)]
    assert "plateau" not in codes(diagnose.run(write_run(tmp_path / "short", short)))
    # one batch at step 300 scored 0.5 below the curve, which fell on after it but never that low
    lucky = [{"step": s, "train_loss": 3.0 - s / 500 + (0.05 if s % 4 else -0.05) - (0.5 if s == 300 else 0)}
             for s in range(0, 400, 2)]
    assert "plateau" not in codes(diagnose.run(write_run(tmp_path / "lucky", lucky)))
    flat = [dict(r, train_loss=r["train_loss"] if r["step"] < 300 else 2.4) for r in lucky]  # a real one
    assert 290 <= found(diagnose.run(write_run(tmp_path / "flat", flat)), "plateau").step <= 300


# ------------------------------------------------------------------ 6. advice from what the log holds

def plateau_entries(lr) -> list[dict]:
    return [{"loss": 2.0 + 2.0 * math.exp(-s / 20), "learning_rate": lr(s), "grad_norm": 1.0, "step": s}
            for s in range(5, 301, 5)]


def test_the_plateau_names_the_logged_lr_and_does_not_advise_decay_after_a_decay(tmp_path):
    flat = found(diagnose.run(trainer_state(tmp_path / "c", plateau_entries(lambda s: 3e-4), 300)), "plateau")
    assert flat.evidence["lr"] == 3e-4 and "lr_scheduler_type='cosine'" in flat.fix
    decayed = found(diagnose.run(trainer_state(tmp_path / "d", plateau_entries(lambda s: 3e-4 * (1 - s / 300)), 300)),
                    "plateau")
    assert "decay the learning rate" not in decayed.fix and "already decayed to 0" in decayed.fix


def test_clipping_is_advised_only_where_the_run_shows_it_off(tmp_path):
    rising = [{"step": 10 * i, "train_loss": v} for i, v in enumerate([4.2, 3.0, 2.5, 9.0, 67.1])]
    off = found(diagnose.run(write_run(tmp_path / "off", rising, train={"grad_clip": 0.0})), "divergence")
    on = found(diagnose.run(write_run(tmp_path / "on", rising, train={"grad_clip": 1.0})), "divergence")
    assert "gradient clipping (it is off: --grad-clip 1.0)" in off.fix
    assert "--grad-clip" not in on.fix and "clipping at 1 is already on" in on.fix


# ------------------------------------------------------------------ 7. spikes against a collapsed median

def test_ordinary_norms_of_a_converged_classifier_are_no_spikes_but_a_real_spike_is(tmp_path):
    norms = [max(2.0 * math.exp(-s / 40), 1e-3) for s in range(1, 601)]
    ordinary = [3.0 if s > 300 and s % 10 == 0 else n for s, n in zip(range(1, 601), norms)]
    entries = [{"loss": max(0.7 * math.exp(-s / 40), 1e-4), "grad_norm": n, "step": s}
               for s, n in zip(range(1, 601), ordinary)]
    assert "grad_spike" not in codes(diagnose.run(trainer_state(tmp_path / "cls", entries, 600)))
    spiked = [dict(e, grad_norm=60.0) if e["step"] == 450 else e for e in entries]
    spike = found(diagnose.run(trainer_state(tmp_path / "spike", spiked, 600)), "grad_spike")
    assert spike.step == 450 and spike.evidence["spikes"] == 1


def test_a_loss_converged_near_zero_is_no_plateau(tmp_path):
    """A public classifier's Trainer log: 0.85 -> 0.004 by step 50, then flat to step 1500 (it cannot
    gain 0.005 nats on 0.004); the same curve lifted by 2 nats is a plateau."""
    curve = [(s, 0.85 * math.exp(-s / 8) + 0.004) for s in range(10, 1501, 10)]
    converged = [{"loss": v, "learning_rate": 5e-5, "step": s} for s, v in curve]
    assert "plateau" not in codes(diagnose.run(trainer_state(tmp_path / "c", converged, 1500)))
    lifted = [dict(e, loss=e["loss"] + 2.0) for e in converged]
    assert codes(diagnose.run(trainer_state(tmp_path / "l", lifted, 1500)))["plateau"] == "info"
