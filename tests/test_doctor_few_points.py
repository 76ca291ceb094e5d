"""Issue 44: a run is too short to judge when what it logged cannot show anything, not when it has
few points. The three 'too short' verdicts of the 51 real logs, in the tests' own words: a
memorising run's 6 evals falling 0.47 -> 0.008 (learning), an eval loss falling 15.4 -> 0.30 over
6 evals (learning), and 2 losses at 10.78 -> 10.77 hundreds of steps apart beside a vocabulary of
50,257 (ln V = 10.82: stuck at uniform, failed); and the runs that stay too short."""

from __future__ import annotations

import math

import pytest

from probes import diagnose
from tests.test_diagnose import write_run


def nanogpt_evals(path, losses, every):
    """nanoGPT's printed eval lines only (its iter lines silenced: log_interval past max_iters)."""
    path.write_text("".join(f"step {i * every}: train loss {v:.4f}, val loss {v:.4f}\n" for i, v in enumerate(losses)))
    return diagnose.run(None, log=path)


def llmc_main_evals(folder, losses, every):
    """llm.c's main.log holding its val losses (`s:N tel:X`) only."""
    folder.mkdir()
    (folder / "main.log").write_text("".join(f"s:{i * every} tel:{v:.4f}\n" for i, v in enumerate(losses)))
    return diagnose.run(folder)


def ours(folder, records, d_vocab):
    return diagnose.run(write_run(folder, records, model={"d_vocab": d_vocab}))


CASES = {  # name -> (how it was logged, verdict, what the first lines say)
    "memorising, 6 evals 0.47 -> 0.008": (
        lambda tmp: nanogpt_evals(tmp / "memo.log", [0.47, 0.2, 0.07, 0.03, 0.014, 0.008], 600),
        "healthy", "6 logged losses, few, but the val loss fell 59x (0.47 -> 0.008): it learns"),
    "an eval loss 15.4 -> 0.30 over 6 evals": (
        lambda tmp: llmc_main_evals(tmp / "out", [15.4, 6.1, 2.2, 0.9, 0.45, 0.30], 250),
        "healthy", "the val loss fell 51x (15.4 -> 0.3)"),
    "2 losses at ln(50257), 500 steps apart": (
        lambda tmp: ours(tmp / "stuck", [{"step": 0, "val_loss": 10.78}, {"step": 500, "val_loss": 10.77}], 50257),
        "failed", "uniform_loss at step 0: the val loss never went below ln(50257) = 10.82"),
    # what cannot show anything stays too short: a loss easing down, or two points 20 steps apart
    "6 losses 4.0 -> 3.5": (
        lambda tmp: ours(tmp / "six", [{"step": s, "train_loss": 4.0 - s / 10} for s in range(6)], 65),
        "too short", "too short to judge: 6 logged losses"),
    "2 losses at ln(50257), 20 steps apart": (
        lambda tmp: ours(tmp / "early", [{"step": 0, "val_loss": 10.78}, {"step": 20, "val_loss": 10.77}], 50257),
        "too short", "too short to judge: 2 logged losses"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_few_points_are_judged_by_what_they_show(tmp_path, name):
    make, verdict, said = CASES[name]
    d = make(tmp_path)
    assert d.verdict == verdict and said in d.format(), d.format()
    if verdict == "failed":
        stuck = next(f for f in d.findings if f.code == "uniform_loss")
        assert stuck.severity == "failed" and stuck.evidence["ln_vocab"] == pytest.approx(math.log(50257))
        assert stuck.evidence["points"] == 2
    if verdict == "healthy":
        assert d.to_dict()["learned"].startswith("the val loss fell") and d.points == 6
