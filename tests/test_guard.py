"""The guard (train.guard): snapshots restored bitwise, the rate cap around the optimizer's step
under any schedule, a healthy run untouched, a spike rescued, escalation to a clean stop, watch
mode, a snapshot that no longer fits refused; the doctor's and the sweep's reading of a rescue."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from models import PRESETS, build_model
from models.checkpoint import list_snapshots, read_metrics
from probes import diagnose
from probes.sweep_parts.stats import first_nonfinite_step
from train.host_copy import HostCopy
from train.monitor import Monitor
from train.guard import Guard, GuardStop
from train.guard.loss_watch import LossWatch
from train.guard.snapshot import HostSnapshot, SnapshotMismatch

CUT = Guard().cut  # the first rescue's rate factor (0.3); the second's is its square
CFG = PRESETS["transformer4_rms_small"].config.replace(n_layers=1, dropout=0.1)  # dropout: draws random numbers


def tiny(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(CFG).train()


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, CFG.d_vocab, (4, CFG.n_ctx + 1), generator=torch.Generator().manual_seed(step))


def loss_of(model: torch.nn.Module, step: int) -> torch.Tensor:
    rows = batch(step)  # [batch pos+1]
    return F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())


def train(model, optimizer, steps: int, log=None, scheduler=None, blow_up_at: int | None = None) -> list[float]:
    """A plain loop; `blow_up_at`: that step's update is taken at a thousand times the rate."""
    losses = []
    for step in range(steps):
        loss = loss_of(model, step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if step == blow_up_at:
            for g in optimizer.param_groups:
                g["lr"] *= 1000
        optimizer.step()
        if step == blow_up_at:
            for g in optimizer.param_groups:
                g["lr"] /= 1000
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
        if log is not None:
            log(step, losses[-1])
    return losses


def state_of(model, optimizer) -> dict[str, torch.Tensor]:
    out = {f"m.{k}": v.clone() for k, v in model.state_dict().items()}
    for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"]):
        for key, value in optimizer.state.get(p, {}).items():
            out[f"o.{i}.{key}"] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def files(root) -> dict[str, bytes]:
    """Every file under `root` but the records (which a rescue appends to), by path: its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.suffix != ".jsonl"}


# ------------------------------------------------------------------ snapshots


def test_a_snapshot_restores_model_optimizer_and_scaler_bitwise():
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # the scale tensor exists from the first scale()
    train(model, optimizer, 3)
    held, snap = state_of(model, optimizer), HostSnapshot()
    snap.take(3, model, optimizer, scaler)
    scale = scaler._scale.clone()
    train(model, optimizer, 4)
    scaler.update(new_scale=3.0)
    assert not same(held, state_of(model, optimizer))
    snap.restore(model, optimizer, scaler)
    assert same(held, state_of(model, optimizer))  # parameters, buffers, exp_avg, exp_avg_sq, step
    assert torch.equal(scaler._scale, scale)
    assert snap.nbytes == sum(v.numel() * v.element_size() for v in held.values() if isinstance(v, torch.Tensor))


def test_a_snapshot_that_no_longer_fits_is_refused_in_one_line_and_changes_nothing():
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, optimizer, 2)
    snap = HostSnapshot()
    snap.take(2, model, optimizer)
    other = build_model(CFG.replace(d_mlp=CFG.d_mlp * 2))
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    train(other, other_opt, 1)
    before = state_of(other, other_opt)
    with pytest.raises(SnapshotMismatch) as err:
        snap.restore(other, other_opt)
    text = str(err.value)
    assert "\n" not in text and "snapshot of step 2 no longer fits" in text and "was [64, 32]" in text
    assert "nothing was restored" in text and same(before, state_of(other, other_opt))


# ------------------------------------------------------------------ the rate cap under any schedule


def nanochat_groups(model):
    """Per-kind rates as nanochat's optimizer sets them (embedding, matrices, unembedding), one schedule."""
    params = dict(model.named_parameters())
    embed = [p for n, p in params.items() if n.startswith("embed")]
    out = [p for n, p in params.items() if "W_out" in n or n.startswith("unembed")]
    rest = [p for p in params.values() if all(p is not q for q in embed + out)]
    return [{"params": embed, "lr": 0.2}, {"params": rest, "lr": 0.02}, {"params": out, "lr": 0.004}]


SCHEDULES = {
    "LambdaLR": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 8)),
    "OneCycleLR": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=40),
    "by hand": None,
    "nanochat groups": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 50),
}


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_the_cap_is_applied_around_the_step_and_the_schedule_stays_in_charge(kind):
    """After a rescue the rate the optimizer applies is the user's x min(1, cap / their highest rate
    since) x a ramp over `rewarm` steps: a climbing schedule trains at the cap, a falling one keeps its
    shape; the user's own numbers are back in the groups after every step."""
    model = tiny()
    groups = nanochat_groups(model) if kind == "nanochat groups" else model.parameters()
    optimizer = torch.optim.AdamW(groups, lr=0.01)
    scheduler = SCHEDULES[kind](optimizer) if SCHEDULES[kind] else None
    run = Guard(every=5).attach(model, optimizer)
    seen = []  # what the optimizer applies: read by a hook after the guard's
    optimizer.register_step_pre_hook(lambda opt, *_: seen.append([g["lr"] for g in opt.param_groups]))
    user, caps = [], None
    for step in range(30):
        if scheduler is None:  # a loop that sets g["lr"] itself every step
            for g in optimizer.param_groups:
                g["lr"] = 0.01 * (1 + step % 7)
        user.append([g["lr"] for g in optimizer.param_groups])
        train(model, optimizer, 1)
        if scheduler is not None:
            scheduler.step()
        assert [g["lr"] for g in optimizer.param_groups] == (scheduler.get_last_lr() if scheduler else user[-1])
        record = run.check(step, math.nan if step == 12 else 4.0)
        if record is not None:
            assert record["action"] == "rewind" and record["restored_step"] == 10
            caps = list(run.ceilings)
            # no update ratios measured: cut x the rate of the last calm update (11) or of the first in trouble
            # (12), whichever is lower; the other groups in the ratio the schedule gives them
            first = CUT * min(user[11][0], user[12][0])
            assert caps == pytest.approx([first * u / user[12][0] for u in user[12]], rel=1e-12)
    assert caps is not None
    for step in range(30):  # after the rescue: x min(1, cap / the highest rate asked for since)
        peaks = [max(u[i] for u in user[13:step + 1]) for i in range(len(caps))] if step > 12 else None
        ramp = min(1.0, (step - 12) / Guard().rewarm)  # back up over `rewarm` steps after the rewind
        expected = user[step] if step <= 12 else [u * min(1.0, c / p) * ramp for u, c, p in zip(user[step], caps, peaks)]
        assert seen[step] == pytest.approx(expected, rel=1e-12)
        assert step <= 12 or all(s <= c * (1 + 1e-12) for s, c in zip(seen[step], caps))  # never above the cap
        if kind == "nanochat groups":
            assert seen[step][0] / seen[step][1] == pytest.approx(10.0)  # the groups keep their ratios
    assert any(s != u for s, u in zip(seen[13:], user[13:]))  # the cap did bite


# ------------------------------------------------------------------ a healthy run, a spike, a stop


def test_a_healthy_run_is_bitwise_untouched(tmp_path):
    results = []
    for guard in (False, True):
        model = tiny()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
        with Monitor(model, optimizer, tmp_path / f"run{guard}", guard=Guard(every=5) if guard else False,
                     report=False) as monitor:
            losses = train(model, optimizer, 40, lambda s, v: monitor.log(s, train_loss=v), scheduler)
        results.append((losses, state_of(model, optimizer), torch.get_rng_state()))
        assert not any("rescue" in r for r in read_metrics(tmp_path / f"run{guard}"))
    (loss_a, state_a, rng_a), (loss_b, state_b, rng_b) = results
    assert loss_a == loss_b and same(state_a, state_b) and torch.equal(rng_a, rng_b)
    # a guarded run that never acted is still told from an unguarded one: run.json and the doctor say so
    unguarded, guarded = (diagnose.run(tmp_path / f"run{guard}") for guard in (False, True))
    assert not unguarded.guard and "guarded" not in unguarded.format()
    assert guarded.guard == Guard(every=5).to_json() and guarded.guard["mode"] == "act" and guarded.guard["every"] == 5
    assert "guarded (act): a snapshot every 5 steps, 4 kept" in guarded.format()


def test_an_eval_step_reads_the_guards_attention_from_its_internals_in_one_forward(tmp_path, monkeypatch):
    """The guard reads attention every 25 steps (EVERY), the Monitor its internals every eval step:
    at steps 0 and 50, both, from one forward (there were two); at step 25, not an eval step, the
    guard's own. Its readings are the records' attn_entropy, number for number."""
    from train.guard.attention import EVERY
    from train.monitor.parts import EvalReadings

    calls = {"measure": 0, "attention": 0}
    for name in calls:
        real = getattr(EvalReadings, name)
        monkeypatch.setattr(EvalReadings, name, lambda self, real=real, name=name: (
            calls.__setitem__(name, calls[name] + 1), real(self))[1])
    seen = []
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    eval_tokens = batch(999)[:2, :-1]
    with Monitor(model, optimizer, tmp_path / "run", guard=Guard(every=5), eval_every=2 * EVERY,
                 eval_tokens=eval_tokens, report=False) as monitor:
        monkeypatch.setattr(monitor.guard.attention, "see", lambda step, reading, n, real=monitor.guard.attention.see:
                            (seen.append((step, reading)), real(step, reading, n))[1])
        train(model, optimizer, 51, lambda s, v: monitor.log(s, train_loss=v))
    assert [step for step, _ in seen] == [0, 25, 50]  # eval steps 0 and 50
    assert calls == {"measure": 2, "attention": 1}  # 0 and 50 from the internals; 25 its own
    entropy = {r["step"]: r["attn_entropy"] for r in read_metrics(tmp_path / "run") if "attn_entropy" in r}
    assert sorted(entropy) == [0, 50] and all(dict(seen)[step] == entropy[step] for step in (0, 50))


def test_a_blow_up_at_a_known_step_is_rescued_from_the_state_before_it(tmp_path, caplog):
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    kept = {}
    mine = tmp_path / "run" / "my_checkpoint.pt"  # the user's own checkpoint, beside the run's snapshots
    with Monitor(model, optimizer, tmp_path / "run", guard=Guard(every=10), save_every=10, report=False) as monitor:
        def log(step, loss):
            if step == 30:
                kept["state"] = state_of(model, optimizer)  # the state the step-30 snapshot holds
                torch.save(model.state_dict(), mine)
            monitor.log(step, train_loss=loss)
            if step == 36:
                kept["disk"] = files(tmp_path / "run")
            if monitor.guard.rescues and "after" not in kept:
                kept["after"] = state_of(model, optimizer)
                kept["disk after"] = files(tmp_path / "run")
        with caplog.at_level(logging.WARNING, logger="train.guard"):
            losses = train(model, optimizer, 60, log, blow_up_at=35)
    rescue = monitor.guard.rescues[0]
    seen = 36 + Guard().patience - 1  # the blow-up's loss shows at 36; `patience` spikes in a row are trouble
    assert rescue["step"] == seen and rescue["trouble_began"] == 36
    assert rescue["action"] == "rewind" and rescue["restored_step"] == 30
    assert rescue["kind"] == "rate_blowup" and "four times the untrained model's" in rescue["why"]
    assert rescue["skipped"] == seen - 30
    assert same(kept["after"], kept["state"])  # the state of step 30, bitwise
    before, after = kept["disk"], kept["disk after"]  # what was on disk before the rewind is untouched
    assert {"my_checkpoint.pt", "step_000020/model.safetensors"} <= set(before)
    assert all(after[path] == data for path, data in before.items())
    assert losses[36] > 1000 and max(losses[seen + 1:]) < max(losses[:35])  # and the run went on, calm
    assert f"guard: rescued at step {seen}" in caplog.text
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert records[seen]["rescue"]["restored_step"] == 30 and records[seen]["train_loss"] == losses[seen]
    assert "diverged" not in records[seen] and first_nonfinite_step(records.values()) is None
    found = {f.code: f for f in diagnose.run(tmp_path / "run").findings}
    assert found["rescued"].step == seen and "restored step 30" in found["rescued"].title
    assert "divergence" not in found and "lower the peak learning rate" in found["rescued"].fix


@pytest.mark.parametrize("warned_at,began,restored", [(20, 20, 10), (10, 36, 30)])
def test_the_doctors_early_warning_moves_the_rewind_before_it(tmp_path, monkeypatch, warned_at, began, restored):
    """Attention logits logged ten-fold their first value at step 20 (the doctor's growth signal),
    the loss blowing up at 36: the trouble began at 20, so the state of step 10 is restored. A
    warning at step 10, more than two snapshot spans (2 x 10 steps) before the trouble, is not
    counted (ten-fold the untrained model's is common in healthy runs): the state of step 30."""
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    monitor = Monitor(model, optimizer, tmp_path / "run", guard=Guard(every=10), eval_every=5,
                      eval_tokens=batch(0)[:, :-1], report=False)
    logits = lambda step: {"attn_logit_max": {"0": [1.0 if step < warned_at else 20.0] * CFG.n_heads}}  # noqa: E731
    monkeypatch.setattr(monitor, "_internals", lambda: HostCopy(logits(monitor._pending_step)))  # as measured
    with monitor:
        def log(step, loss):
            monitor._pending_step = step
            monitor.log(step, train_loss=loss)
        train(model, optimizer, 40, log, blow_up_at=35)
    [rescue] = [r["rescue"] for r in read_metrics(tmp_path / "run") if "rescue" in r]
    assert rescue["trouble_began"] == began and rescue["restored_step"] == restored
    assert rescue.get("warned") == (f"max attention logit at step {warned_at}" if began == warned_at else None)


def test_repeated_trouble_cuts_deeper_then_stops_cleanly_and_saves(tmp_path, caplog):
    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    bad = {12, 17, 23}  # three NaN losses: two rescues, then the stop
    with pytest.raises(GuardStop) as stop, caplog.at_level(logging.ERROR, logger="train.guard"):
        with Monitor(model, optimizer, tmp_path / "run", guard=Guard(every=5, max_rescues=2), save_every=0,
                     report=False) as monitor:
            for step in range(40):
                loss = loss_of(model, step)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                held = state_of(model, optimizer)
                monitor.log(step, train_loss=math.nan if step in bad else loss.item())
    assert stop.value.code == 3 and monitor.closed
    rescues = [r["rescue"] for r in read_metrics(tmp_path / "run") if "rescue" in r]
    assert [r["action"] for r in rescues] == ["rewind", "rewind", "stop"]
    assert [r["factor"] for r in rescues[:2]] == pytest.approx([CUT, CUT ** 2])  # a deeper cut
    # no snapshot is taken while a rewound run has not yet shown it heads back to its level: the state
    # restored (step 10) stays the first to go back to
    assert [r["restored_step"] for r in rescues] == [10, 10, 10]
    assert (tmp_path / "run" / "step_000010").is_dir() and len(list_snapshots(tmp_path / "run")) == 1
    from models.checkpoint import load_snapshot
    saved = load_snapshot(tmp_path / "run" / "step_000010").model.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())  # the last good state
    assert not same(held, state_of(model, optimizer))  # the model in memory holds it too, not step 23's
    line = next(r.message for r in caplog.records if r.levelno == logging.ERROR)
    assert "\n" not in line and "stopped the run at step 23" in line and "after 2 rescue(s)" in line
    assert f"lower the peak learning rate below {0.1 * CUT ** 2:.3g}" in line and "normalise queries and keys" in line


def test_watch_mode_logs_what_it_would_do_and_changes_nothing(tmp_path):
    runs = []
    for guard in (False, "watch"):
        model = tiny()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        with Monitor(model, optimizer, tmp_path / f"w{guard}", guard=guard, report=False) as monitor:
            losses = train(model, optimizer, 50, lambda s, v: monitor.log(s, train_loss=v), blow_up_at=35)
        runs.append((losses, state_of(model, optimizer)))
    assert runs[0][0] == runs[1][0] and same(runs[0][1], runs[1][1])
    would = [r for r in read_metrics(tmp_path / "wwatch") if "rescue" in r]
    assert would and would[0]["rescue"]["action"] == "watch: would rewind"
    codes = {f.code for f in diagnose.run(tmp_path / "wwatch").findings}
    assert "guard_would_rescue" in codes


# ------------------------------------------------------------------ settings and the detector


@pytest.mark.parametrize("options, words", [
    ({"mode": "fix"}, "mode must be one of act, watch"), ({"cut": 0}, "cut must be a number in (0, 1)"),
    ({"cut": "0.3"}, "cut must be a number in (0, 1), got '0.3'"), ({"cut": None}, "cut must be a number"),
    ({"sigma": "6"}, "sigma must be a positive number, got '6'"), ({"floor": True}, "floor must be a number"),
    ({"every": 0}, "every must be an integer in [1, "), ({"sigma": math.nan}, "sigma must be a positive number"),
    ({"keep": 1.5}, "keep must be an integer in [1, 64]"), ({"keep": 10 ** 8}, "keep must be an integer in [1, 64]"),
    ({"window": 10 ** 9}, "window must be an integer in [2, 1000000]"), ({"hold": 2}, "hold must be above patience"),
    ({"scaler": "amp"}, "scaler must be a torch.amp.GradScaler or None, got str")])
def test_bad_settings_are_refused_in_one_line(options, words, tmp_path):
    with pytest.raises(ValueError) as err:
        Guard(**options)
    assert words in str(err.value) and "\n" not in str(err.value)
    model = tiny()
    with pytest.raises(ValueError, match="guard must be True, False, 'watch'"):
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), tmp_path / "run", guard="yes")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_the_detector_traces_a_creeping_loss_back_to_where_it_began():
    watch = LossWatch()
    noise = [0.02 * ((i * 37) % 11 - 5) for i in range(200)]  # a fixed, zero-mean wiggle
    for step in range(100):
        assert not watch.see(step, 3.0 + noise[step])
    for step in range(100, 130):  # creeping up 0.02 a step: no single spike
        assert not watch.see(step, 3.0 + 0.02 * (step - 99) + noise[step])
    assert watch.see(130, 9.0) and watch.see(131, 9.5)  # spikes, in a row
    assert [s for s, _ in watch.excursion] == [130, 131]
    assert 100 <= watch.trouble_began() <= 115
    assert LossWatch().see(0, math.inf)  # a non-finite loss is a spike at once


def test_a_spiking_step_is_never_calm_and_trouble_is_dated_at_its_first_spike():
    """Defect 1: with a loss falling fast, the window's mean lags above the current level; a spike
    was counted calm (a snapshot of a state in trouble) and trouble dated a step late."""
    watch = LossWatch()
    for step in range(150):  # falling from 4 to 2.5, a small wiggle
        assert not watch.see(step, 4.0 - 1.5 * step / 150 + 0.01 * (step % 3 - 1))
    assert watch.calm(149)
    assert watch.see(150, 4.2)  # a garbage batch: far above a level near 2.5, below the window's mean
    assert not watch.calm(150) and watch.trouble_began() == 150
