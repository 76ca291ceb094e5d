"""probes.development and probes.development_parts.phase_changes: a hand-set previous-token and induction head scored on
paper across a run's snapshots, the phase change found at the snapshot the heads were switched on,
the cache beside each snapshot, and induction heads a test trains itself, found in layer 1 within
one snapshot of the repeated-part loss's steepest drop."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from development_kit import V, hand_set, save_run
from probes import development
from probes.development_parts.inputs import REPEAT_SAMPLES
from probes.development_parts.phase_changes import Move, group_moves, loss_evidence, phase_changes, sharp_moves
from train.repetition import train

TOKENS = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])  # period 4, distinct within a period
SWITCHED_ON = 300  # the hand-set heads' scale goes from 0 (uniform attention) to 40 here
# float32 softmax of a one-hot pattern at scale 40 leaks e^-40 per key; the sums are float32
TOL = 1e-5


@pytest.fixture(scope="module")
def hand_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("hand") / "run"
    return save_run(run_dir, [(s, hand_set(0.0 if s < SWITCHED_ON else 40.0)) for s in range(0, 500, 100)])


def test_hand_set_heads_scored_on_paper_and_their_phase_change(hand_run):
    result = development.run(hand_run, tokens=TOKENS)
    assert [s["step"] for s in result.snapshots] == [0, 100, 200, 300, 400]
    last = result.snapshots[-1]
    scores = last["scores"]
    # layer 0 attends i -> i-1 on rows 1..7, row 0 to itself: 7 of 8 rows; its sink: rows 0 and 1
    # layer 1: rows 4..7 find the token after the earlier copy (induction 4/8, Olsson's score 1);
    # rows 1..3 see no copy and spread over keys 1..i, previous-token mass 0 + 1/2 + 1/3 of 8 rows
    on_paper = {("previous_token", 0): 7 / 8, ("sink", 0): 2 / 8, ("induction", 1): 4 / 8,
                ("previous_token", 1): (1 / 2 + 1 / 3) / 8, ("sink", 1): 1 / 8, ("induction_repeat", 1): None}
    for (name, layer), want in on_paper.items():
        if want is not None:
            assert scores[name][layer][0] == pytest.approx(want, abs=TOL), (name, layer)
    # the unembedding reads the current token only: every position's loss is ln(e + 15), so the
    # in-context score (late minus early) is 0
    assert last["loss"] == pytest.approx(math.log(math.e + V - 1), rel=1e-6)
    assert last["icl_score"] == pytest.approx(0.0, abs=1e-6)
    kinds = {c["kind"]: c for c in result.phase_changes}
    # switched on after the snapshot at 200, by the one at 300: the step is read between them, and named so
    assert 200 < kinds["induction_heads"]["step"] <= SWITCHED_ON and kinds["induction_heads"]["heads"] == [[1, 0]]
    assert kinds["induction_heads"]["evidence"]["crossed_between"] == [200, SWITCHED_ON]
    assert 200 < kinds["previous_token_heads"]["step"] <= SWITCHED_ON
    assert kinds["previous_token_heads"]["heads"] == [[0, 0]]
    evidence = kinds["induction_heads"]["evidence"]
    assert (evidence["from_step"], evidence["to_step"]) == (200, 300)
    assert evidence["per_head"][0]["after"] > evidence["per_head"][0]["before"] + 0.5
    assert set(result.to_dict()) == {"snapshots", "phase_changes"}


def test_a_hand_set_induction_head_that_writes_nothing_the_logits_read_is_not_confirmed():
    """Olsson's score of L1H0 is 1, but its W_O is 0 and the unembedding reads the token alone: removing
    it leaves every logit as it was, so `probes.heads --confirm` does not confirm it (a rise of exactly 0)."""
    from probes.common import random_repeat_tokens
    from probes.development_parts.phase_ablation import confirm_induction

    tokens = random_repeat_tokens(V, 4, 4, seed=0)  # [4 8]
    (found,) = confirm_induction(hand_set(40.0), (tokens, 4), [[0.0], [1.0]])
    assert found == {"head": [1, 0], "induction_repeat": 1.0, "loss_rise": 0.0, "confirmed": False}


def test_olsson_score_of_the_hand_set_induction_head_is_one():
    from probes import heads

    result = heads.run(hand_set(40.0), TOKENS, repeat_period=4, copying=False)
    assert result.induction_repeat[1][0] == pytest.approx(1.0, abs=TOL)
    assert result.induction_repeat[0][0] == pytest.approx(0.0, abs=TOL)


def test_readings_cached_beside_each_snapshot_and_a_stale_one_recomputed(hand_run, caplog):
    first = development.run(hand_run, tokens=TOKENS)
    again = development.run(hand_run, tokens=TOKENS)
    assert {s["from"] for s in again.snapshots} == {"cache"}
    assert json.dumps(again.to_dict()["phase_changes"]) == json.dumps(first.to_dict()["phase_changes"])
    cached = hand_run / "step_000400" / "development.json"
    kept = cached.read_bytes()
    save_run(hand_run, [(400, hand_set(0.0))])  # other weights under the same name ...
    cached.write_bytes(kept)  # ... beside the reading of the old ones
    with caplog.at_level(logging.INFO, logger="probes.development"):
        changed = development.run(hand_run, tokens=TOKENS)
    assert [s["from"] for s in changed.snapshots] == ["cache"] * 4 + ["computed"]
    assert any("other weights" in r.getMessage() for r in caplog.records)
    other_text = development.run(hand_run, tokens=TOKENS.flip(-1))
    assert {s["from"] for s in other_text.snapshots} == {"computed"}


def test_cli_json_and_bad_input(hand_run, tmp_path, capsys):
    assert development.main(["--ckpt", str(hand_run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"snapshots", "phase_changes"} and len(out["snapshots"]) == 5
    assert development.main(["--ckpt", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nowhere" in err[0]


def test_pure_functions_on_paper():
    losses = torch.arange(20, dtype=torch.float64)[None]  # loss i at position i
    # late: positions 18, 19 (mean 18.5); early: positions 1, 2 (5%..15% of 20; mean 1.5)
    assert development.icl_score(losses) == pytest.approx(17.0)
    logits = torch.zeros(1, 6, 3)
    logits[0, 3:, 0] = math.log(2.0)  # from the copy's first token on, token 0 twice as likely
    tokens = torch.tensor([[0, 1, 0, 0, 1, 0]])  # period 3; the copy predicts tokens 4, 5
    # row 3 -> token 1: p = 1/4; row 4 -> token 0: p = 2/4
    assert development.repeat_half_loss(logits, tokens, 3) == pytest.approx((math.log(4) + math.log(2)) / 2)


@pytest.mark.parametrize("series, want", [
    ([0, 0, 0, 0, 1, 1, 1, 1, 1, 1], [(2, 4, 4)]),  # a step: window of 2 intervals, past half at 4
    ([1, 1, 1, 0.2, 0.1, 0.1, 0.1], [(2, 3, 3)]),  # a fall
    ([i / 9 for i in range(10)], []),  # a ramp over the whole run: 2/9 of its range per window
    ([0.0, 0.05, 0.1, 0.05, 0.0], []),  # a range under MIN_RANGE
    ([0, 0, float("nan"), 1], []),  # a diverged snapshot
])
def test_sharp_moves(series, want):
    assert sharp_moves(series) == want


def test_grouped_moves_and_loss_alignment():
    moves = [Move(1, 0, 2, 4, 4, 3.5, 0.0, 1.0, 1.0), Move(1, 1, 2, 4, 5, 4.5, 0.0, 1.0, 1.0),
             Move(0, 0, 6, 8, 8, 7.5, 0, 1, 1)]
    assert [[(m.layer, m.head) for m in g] for g in group_moves(moves)] == [[(1, 0), (1, 1)], [(0, 0)]]
    curve = [(0, 3.0), (10, 3.0), (20, 3.0), (25, 3.4), (30, 2.0), (40, 1.9)]
    # flat over 10..20, a bump of 0.4 above both ends of 20..30, then the loss falls: a plateau's end
    assert loss_evidence(curve, 20, 30) == {"before": 3.0, "after": 2.0, "bump": pytest.approx(0.4),
                                            "plateau_end": True}
    grid = [[[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 0.9]], [[1.0, 0.9]]]
    changes = phase_changes([0, 10, 20, 30, 40], {"induction": grid}, repeat_loss=[3, 3, 3, 1, 1],
                            loss_curve=curve)
    # the scores jump between the snapshots of steps 20 and 30: half-way there, at 25
    assert [(c["kind"], c["step"], c["heads"]) for c in changes] == [("induction_heads", 25, [[0, 0], [0, 1]])]
    assert changes[0]["evidence"]["crossed_between"] == [20, 30]
    assert changes[0]["evidence"]["repeat_loss"] == {"before": 3, "after": 1}
    # head 0 steps up 0.6 at 40; head 2 rises 0.4 over the same window (0.44 of its range 0.9: no sharp
    # move of its own) and joins; head 3 rises 0.2 there (under half of 0.6) and does not
    grid = [[[0.6 if i >= 4 else 0.0, 0.0, a, b]] for i, (a, b) in
            enumerate(zip([0, 0.05, 0.1, 0.1, 0.5, 0.5, 0.6, 0.7, 0.9], [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]))]
    (joined,) = phase_changes(list(range(0, 90, 10)), {"induction": grid})
    assert (joined["step"], joined["heads"]) == (35, [[0, 0], [0, 2]])


@pytest.mark.parametrize("middle", [712, 741, 779, 790])
def test_the_step_is_where_the_score_crosses_half_its_move_between_the_snapshots(middle):
    """A score rising as a logistic centred at `middle`, read at snapshots every 40 steps: the step is
    within a quarter of a snapshot of the middle (the first snapshot past half was up to one late: 840
    for a move half-way at 741, a user's run), the bracketing snapshots hold it."""
    steps = list(range(0, 1201, 40))
    scores = [1 / (1 + math.exp(-(s - middle) / 30)) for s in steps]
    (change,) = phase_changes(steps, {"induction": [[[x]] for x in scores]})
    low, high = change["evidence"]["crossed_between"]
    assert abs(change["step"] - middle) <= 10 and low <= middle <= high and high - low == 40


def test_entropy_leaving_the_untrained_model_is_no_phase_change():
    """Every head's entropy falls from near-uniform as training starts (windows from the first snapshot):
    no change; the same fall later in the run is one."""
    steps = list(range(0, 200, 20))
    early = [1.0, 0.7, 0.5, 0.45, 0.45, 0.44, 0.44, 0.44, 0.44, 0.44]
    late = [1.0, 0.98, 0.97, 0.97, 0.96, 0.6, 0.4, 0.4, 0.4, 0.4]
    assert phase_changes(steps, {"entropy": [[[x]] for x in early]}) == []
    (change,) = phase_changes(steps, {"entropy": [[[x]] for x in late]})
    assert change["kind"] == "entropy_collapse" and 80 < change["step"] <= 100


@pytest.mark.slow
def test_trained_induction_heads_found_in_layer_1_at_the_loss_drop(tmp_path):
    torch.set_num_threads(1)  # the same float sums on every run of this test on one machine
    tokens, measured = train(tmp_path / "run", steps=300, every=15)
    # by hand: the snapshot ending the steepest one-snapshot fall of the repeated part's loss
    falls = [(before[1] - after[1], after[0]) for before, after in zip(measured, measured[1:])]
    drop_step = max(falls)[1]
    assert measured[-1][1] < 0.5 * measured[0][1]  # the repeats are learned
    result = development.run(tmp_path / "run", tokens=tokens, cache=False)
    induction = [c for c in result.phase_changes if c["kind"] == "induction_heads"]
    assert induction, result.phase_changes
    assert all(layer == 1 for c in induction for layer, _ in c["heads"])
    assert min(abs(c["step"] - drop_step) for c in induction) <= 15  # within one snapshot
    repeat = [s["repeat_loss"] for s in result.snapshots]
    assert repeat[-1] < 0.5 * repeat[0]  # the tool's own repeated sequence: its second half learned too
    # causal: ablating the change's heads at the snapshot ending it undoes the repeat's learning, and
    # zero-ablating a head's z is zeroing its rows of W_O by hand (no b_O): the same loss
    ablation = induction[0]["ablation"]
    loss = ablation["repeat_loss"]
    assert loss["without"] > loss["with"] + 1.0, ablation
    by_hand = zeroed_heads_repeat_loss(tmp_path / "run" / ablation["snapshot"], induction[0]["heads"])
    assert loss["without"] == pytest.approx(by_hand, rel=1e-5)  # float32 sums in two orders, ~1e-7 each


def zeroed_heads_repeat_loss(snapshot, heads) -> float:
    """The repeat's second-half loss (development's repeat, by its functions) with each head's W_O rows zeroed."""
    from models.checkpoint import load_checkpoint
    from probes.common import random_repeat_tokens

    model = load_checkpoint(snapshot).model
    d_head = model.cfg.d_head
    with torch.no_grad():
        for layer, head in heads:
            model.blocks[layer].attention.W_O[head * d_head:(head + 1) * d_head] = 0.0
        length = model.cfg.n_ctx // 2
        tokens = random_repeat_tokens(model.cfg.d_vocab, length, REPEAT_SAMPLES, seed=0)
        return development.repeat_half_loss(model(tokens), tokens, length)


def test_the_doctor_joins_a_collapse_and_a_sink_to_the_loss(tmp_path):
    """Read from the development readings the run's records hold, never from the development.json
    caches a page leaves: caching them changes nothing. The hand-set heads' entropy falls at 300 as
    they take their roles (a note); a head that collapses onto the first position (a sink) while
    the loss rises and no role is gained: a warning and a sink note at the same step; the same with
    the loss falling, or a head that only sharpens: no warning."""
    from models.checkpoint import append_metrics
    from probes.doctor import diagnosis

    run = save_run(tmp_path / "run", [(s, hand_set(0.0 if s < SWITCHED_ON else 40.0)) for s in range(0, 500, 100)])

    def write(losses, readings=()):  # metrics.jsonl: a loss every 50 steps, the readings at their steps
        (run / "metrics.jsonl").unlink(missing_ok=True)
        at = {r["step"]: r for r in readings}
        for step in range(0, 550, 50):
            append_metrics(run, {"step": step, "train_loss": losses(step),
                                 **({"development": at[step]} if step in at else {})})

    def development_findings():
        return {f.code: f for f in diagnosis.run(run).findings if f.page == "development"}

    write(lambda step: 3.0)
    before = diagnosis.run(run).to_dict()
    readings = development.run(run, tokens=TOKENS).snapshots  # the page's reading: cached beside each snapshot
    assert sorted(run.glob("step_*/development.json")) and diagnosis.run(run).to_dict() == before
    write(lambda step: 3.0, readings)
    found = development_findings()
    assert found["head_entropy_collapse"].severity == "info" and 200 < found["head_entropy_collapse"].step <= SWITCHED_ON
    assert found["head_entropy_collapse"].evidence["with_a_role"] == 2

    def sink_reading(reading, on_entropy):  # L0H0 onto position 0 from 300, no role gained
        on = reading["step"] >= SWITCHED_ON
        scores = {name: [[0.95 if on and name == "sink" else 0.05], [0.05]]
                  for name in ("previous_token", "duplicate_token", "induction", "sink", "induction_repeat")}
        return {**reading, "entropy": [[on_entropy if on else 0.9], [0.9]], "scores": scores}

    rising = lambda step: 3.0 + 0.01 * (step % 100 == 50) + (0.5 if step >= 250 else 0.0)  # noqa: E731
    write(rising, [sink_reading(r, 0.05) for r in readings])
    found = development_findings()
    collapse, sink = found["head_entropy_collapse"], found["sink_forming"]
    # read between the snapshots at 200 and 300 that bracket the switch: half-way, at 250
    assert (collapse.severity, collapse.step, collapse.where) == ("warning", 250, ("L0H0",))
    assert collapse.evidence["loss_bump"] == pytest.approx(0.5)  # after minus before, the noise 0.01
    assert (sink.step, sink.where) == (250, ("L0H0",))
    falling = lambda step: 2.27 if step < 250 else 2.17  # noqa: E731
    write(falling, [sink_reading(r, 0.05) for r in readings])
    assert development_findings()["head_entropy_collapse"].severity == "info"
    write(rising, [sink_reading(r, 0.7) for r in readings])  # 0.9 -> 0.7: sharper, not collapsed
    assert "head_entropy_collapse" not in development_findings()


def test_the_repetition_run_reads_its_own_text(tmp_path, capsys):
    from train import repetition

    assert repetition.main(["--out", str(tmp_path / "run"), "--steps", "30", "--every", "15"]) == 0
    result = development.run(tmp_path / "run")
    assert [s["step"] for s in result.snapshots] == [0, 15, 30]
    assert "data.txt (the run's data)" in result.source
    assert [s for s, _ in result.loss_curve] == [5, 10, 15, 20, 25, 30]  # the Monitor's records: every 15 // 3 steps
    assert repetition.main(["--out", str(tmp_path / "run")]) == 2  # never over a run


def test_given_tokens_longer_than_the_context_are_read_in_full_windows(hand_run):
    long = torch.arange(20)[None] % V  # windows of 8, 8 and 4 tokens: the short one is left out
    result = development.run(hand_run, tokens=long, cache=False)
    assert result.source == "the given tokens (2 window(s) of 8)"
