"""The doctor reads a run the guard rescued as rescued (probes.doctor.rescues): a rewind is no
overfitting, a data spike's advice is the data at the steps skipped (never a rate), a rate blow-up's
is the rate the rescue settled on, a data shift is no problem. Hand-written metrics.jsonl histories
in the guard's record contract (docs/guard.md)."""

from __future__ import annotations

import pytest

from probes import diagnose
from test_diagnose import codes, finding, write_run


def falling(first: int, last: int, start: float, per_step: float, val_every: int = 0,
            val_start: float | None = None) -> list[dict]:
    """Records every 10 steps, the train loss falling `per_step` a step; a val loss every
    `val_every` steps falling the same, from `val_start`."""
    out = []
    for s in range(first, last + 1, 10):
        r = {"step": s, "train_loss": start - per_step * (s - first), "lr": 0.01}
        if val_every and s % val_every == 0:
            r["val_loss"] = (val_start if val_start is not None else start + 0.1) - per_step * (s - first)
        out.append(r)
    return out


REWIND = {"kind": "rate_blowup", "action": "rewind", "why": "the loss spiked three times in 20 steps",
          "trigger": "a loss spike", "trouble_began": 118, "number": 1, "restored_step": 50, "skipped": 70,
          "lr_cap": 0.003, "factor": 0.3, "rate_from": "the update ratios' healthy band"}


@pytest.mark.parametrize("after, overfits", [
    # after the rewind the val loss comes back down from where the restored state had it, still above
    # the best before the trouble (2.3 at step 100) as the train loss falls below its 2.2 then: no overfitting
    ([2.6, 2.5, 2.45, 2.42, 2.4], False),
    # after the rewind it falls, then rises while the train loss keeps falling: overfitting, after it
    ([2.5, 2.35, 2.4, 2.45, 2.5], True),
])
def test_a_rewind_is_not_read_as_overfitting(tmp_path, after, overfits):
    before = falling(0, 110, 3.0, 0.008, val_every=20)  # val 3.1 - 0.008 * step: 2.3 at step 100
    trouble = [{"step": 120, "train_loss": 6.0, "val_loss": 5.0, "lr": 0.01, "rescue": REWIND}]
    later = [{"step": s, "train_loss": 2.1 - 0.004 * (s - 130), "lr": 0.003} for s in range(130, 330, 10)]
    for r, v in zip([r for r in later if r["step"] % 40 == 0], after):
        r["val_loss"] = v
    d = diagnose.run(write_run(tmp_path / "run", before + trouble + later))
    assert ("overfitting" in codes(d)) == overfits
    if overfits:  # its best is one measured after the rewind
        assert finding(d, "overfitting").evidence["best_step"] > 120
    assert "divergence" not in codes(d, "warning")  # the rescued step is no divergence


@pytest.mark.parametrize("action", ["skip", "refuse"])
def test_a_data_spike_is_read_as_bad_batches_with_no_rate_advice(tmp_path, action):
    spike = {"kind": "data_spike", "action": action, "why": "5 batches' loss was 4 nats above the model's on "
             "other data", "trigger": "a loss spike", "trouble_began": 150, "number": 1, "restored_step": None,
             "skipped": 5, "skipped_steps": [150, 151, 152, 153, 154], "lr_cap": None, "factor": None,
             "rate_from": None}
    records = falling(0, 300, 3.0, 0.003, val_every=50)
    for r in records:
        if r["step"] == 150:
            r.update(train_loss=7.2, rescue=spike)
    d = diagnose.run(write_run(tmp_path / "run", records))
    rescued = finding(d, "rescued")
    assert rescued.severity == "warning" and "150-154" in rescued.title
    assert ("refused the update(s) of 5 batch(es)" in rescued.title) == (action == "refuse")  # their updates never taken
    assert "check the data at steps 150-154" in rescued.fix
    assert "learning rate" not in rescued.fix.replace("the learning rate was not the cause", "")
    assert all("lower the peak" not in f.fix for f in d.findings if f.fix)  # no finding advises a rate


def test_a_rate_blowup_is_advised_the_rate_the_rescue_settled_on(tmp_path):
    """Two rate rescues (at rate 1.0, cap 0.3; at 0.3, cap 0.09), a data spike between (no cap of its
    own), then the cap lifted to 0.2: the rates logged are the capped ones; each rate finding advises
    about 0.2 (the highest it trained at calmly after its last rescue, below the 0.3 that blew up),
    the data spike the data."""
    def rate(n, cap, began):
        return {**REWIND, "number": n, "lr_cap": cap, "factor": cap, "trouble_began": began}
    data = {"kind": "data_spike", "action": "skip", "why": "one batch far above", "trigger": "a loss spike",
            "trouble_began": 80, "number": 3, "skipped": 1, "skipped_steps": [80], "lr_cap": None}
    lift = {"kind": "rate_blowup", "action": "lift", "why": "calm for 100 steps", "trigger": "calm",
            "trouble_began": None, "number": 4, "restored_step": None, "skipped": 0, "lr_cap": 0.2, "factor": 0.2}
    records = with_rates(falling(0, 300, 3.0, 0.003), lambda s: 1.0 if s <= 30 else 0.3 if s <= 60 else
                         0.09 if s < 200 else 0.2)
    events = {30: rate(1, 0.3, 25), 60: rate(2, 0.09, 55), 80: data, 200: lift}
    for r in records:
        if r["step"] in events:
            r["rescue"] = events[r["step"]]
    d = diagnose.run(write_run(tmp_path / "run", records, model={"n_heads": 2, "qk_norm": "none"}))
    rescued = [f for f in d.findings if f.code == "rescued"]
    assert [f.step for f in rescued] == [30, 60, 80]  # a lift is no finding of its own
    for f in rescued[:2]:
        assert "lower the peak learning rate to about 0.2 " in f.fix and "0.09" not in f.fix
    assert rescued[2].fix.startswith("check the data at steps 80")


def with_rates(records: list[dict], lr) -> list[dict]:
    for r in records:
        r["lr"] = lr(r["step"])
    return records


COLLAPSE = {**REWIND, "why": "head 3 of layer 3 collapsed: its attention entropy fell from 0.89 to 0.28 of uniform "
            "attention's between steps 75 and 100", "trouble_began": 76, "restored_step": 70, "lr_cap": 0.01}
SHIFT = {"kind": "data_shift", "action": "none", "why": "1 loss(es) up to 4.1 for 16 steps, falling: a new level",
         "trigger": "a new level", "trouble_began": 254, "number": 0, "restored_step": None, "skipped": 0,
         "lr_cap": None, "factor": None}


@pytest.mark.parametrize("events, lr, cause, fix, gone", [
    # set off by attention: no word of the loss blowing up; advised the rate it trained at calmly after
    ({100: COLLAPSE}, lambda s: 0.03 if s <= 100 else 0.01, "attention collapsed fast", "about 0.01 ", ()),
    # a shift noted at 270, then a rewind of the same episode to before it began: one story, the rewind's
    ({270: SHIFT, 280: {**REWIND, "trouble_began": 254, "restored_step": 250, "lr_cap": 0.01}},
     lambda s: 0.03 if s <= 280 else 0.01, "blew up", "about 0.01 ", ("data_shift",)),
    # a cap lifted late in the decay (it never limited the rate again): the highest rate trained at
    # calmly, 0.015, never "none for the rate" (the schedule's 0.03 blew up and was never tried again)
    ({100: {**REWIND, "trouble_began": 95, "lr_cap": 0.01}, 250: {"kind": "rate_blowup", "action": "lift",
      "why": "calm", "trouble_began": 250, "number": 1, "lr_cap": None}},
     lambda s: 0.03 if s <= 100 else 0.01 if s < 250 else 0.015 * (1 - (s - 250) / 100), "blew up", "about 0.015 ", ()),
    # the cap lifted back to the rate the run was rescued from: not advised; the highest below it is
    ({100: {**REWIND, "trouble_began": 95, "lr_cap": 0.01}, 200: {"kind": "rate_blowup", "action": "lift",
      "why": "calm", "trouble_began": 200, "number": 1, "lr_cap": 0.03}},
     lambda s: 0.03 if s <= 100 or s >= 200 else 0.01, "blew up", "about 0.01 ", ()),
    # lifted early and trained calmly at the schedule's full rate after: nothing to change in the rate
    ({100: {**REWIND, "trouble_began": 95, "lr_cap": 0.01}, 150: {"kind": "rate_blowup", "action": "lift",
      "why": "calm", "trouble_began": 150, "number": 1, "lr_cap": None}},
     lambda s: 0.01 if 100 < s < 150 else 0.03, "blew up", "none for the rate", ()),
])
def test_the_story_of_a_rescue_names_its_cause_and_a_rate_the_evidence_says_was_stable(tmp_path, events, lr, cause,
                                                                                      fix, gone):
    records = with_rates(falling(0, 330, 3.0, 0.003), lr)
    for r in records:
        if r["step"] in events:
            r["rescue"] = events[r["step"]]
    d = diagnose.run(write_run(tmp_path / "run", records, model={"n_heads": 2, "qk_norm": "none"}))
    [rescued] = [f for f in d.findings if f.code == "rescued"]
    assert cause in rescued.cause and fix in rescued.fix
    assert ("blew up" in rescued.cause) == (cause == "blew up")
    assert not set(gone) & set(codes(d))
    if gone:
        assert "noted as a data shift at step 270 first" in rescued.title


def test_records_without_a_kind_read_as_before(tmp_path):
    """A guard's records from before it judged kinds: a rewind is a rate rescue, advised its cap; a
    watching guard's would-be rewind a warning."""
    old = {"action": "rewind", "trigger": "a loss spike", "trouble_began": 40, "restored_step": 20, "number": 1,
           "lr_cap": 0.003, "factor": 0.3, "skipped": 21}
    watch = {**old, "action": "watch: would rewind", "number": 2, "lr_cap": 0.0009}
    records = falling(0, 200, 3.0, 0.003)
    records[4]["rescue"], records[12]["rescue"] = old, watch  # steps 40 and 120
    d = diagnose.run(write_run(tmp_path / "run", records))
    assert "lower the peak learning rate to about 0.003 " in finding(d, "rescued").fix
    would = finding(d, "guard_would_rescue")
    assert would.severity == "warning" and "rewound it to step 20" in would.title


def test_a_data_shift_is_information_not_a_problem(tmp_path):
    shift = {"kind": "data_shift", "action": "none", "why": "the loss moved 0.6 nats to a new level and has "
             "fallen since", "trigger": "a new level", "trouble_began": 150, "number": 1, "restored_step": None,
             "skipped": 0, "lr_cap": None, "factor": None}
    records = falling(0, 140, 2.6, 0.002) + falling(150, 300, 2.9, 0.002)
    records[15]["rescue"] = shift  # step 150
    d = diagnose.run(write_run(tmp_path / "run", records))
    assert finding(d, "data_shift").severity == "info"
    assert not {"rescued", "guard_stopped", "data_shift"} & set(codes(d, "warning"))
