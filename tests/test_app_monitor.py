"""The app on runs written by `train.monitor.Monitor` from someone else's loop (a nanoGPT-layout
model): a run that saved no weights opens on its history (diagnosis, loss curve, training
dynamics) and the model pages say what they need; with `save_every` the snapshots are our
model, whose logits equal the live nanoGPT model's, and the model pages read them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from probes.first_view import PAGE_TEXT
from chart_kit import frames
from models.checkpoint import load_checkpoint
from models.store.run import read_metrics
from models.tokenizers import CharTokenizer
from nanogpt_ref import GPT, GPTConfig
from probes import diagnose
from test_app_doctor import start  # noqa: F401 (fixture)
from train.monitor import Monitor

TEXT = "the king and the queen shall not be what thou art, my good lord.\n" * 20
VOCAB_TEXT = TEXT + PAGE_TEXT + "ROMEO:"  # the sidebar's text and the Overview's prompt encode
STEPS = 30


def monitored_run(out: Path, save_every: int = 0) -> tuple[torch.nn.Module, CharTokenizer]:
    """A nanoGPT GPT trained STEPS steps by a plain loop with the Monitor in it."""
    tokenizer = CharTokenizer.from_text(VOCAB_TEXT)
    ids = torch.tensor(tokenizer.encode(TEXT))  # [n]
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    windows = ids[: 8 * 17].view(8, 17)  # [batch block+1]
    with Monitor(model, optimizer, out, log_every=5, eval_every=10, eval_tokens=windows[:2, :16],
                 save_every=save_every, tokenizer=tokenizer, report=False) as monitor:
        for step in range(STEPS + 1):
            logits = model(windows[:, :-1])  # [batch pos vocab]
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.log(step, train_loss=loss.item())
    return model, tokenizer


@pytest.fixture(scope="module")
def history_only(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("monitored")
    monitored_run(root / "mine")
    return root


def test_a_run_without_weights_opens_on_its_history(start, history_only):  # noqa: F811
    run = history_only / "mine"
    at = start("mine", roots=[history_only])
    expected = diagnose.run(run)
    verdicts = [b.value for b in [*at.success, *at.warning, *at.error] if b.value.startswith("Verdict")]
    assert verdicts and f"**{expected.verdict}**" in verdicts[0]
    assert any("training history only" in i.value and "Monitor `save_every=N`" in i.value for i in at.info)
    assert not at.error or all(e.value.startswith("Verdict") for e in at.error)
    losses = [f for chart in at.get("vega_lite_chart") for f in frames(chart) if "loss" in f.columns]
    logged = {r["step"]: r["train_loss"] for r in read_metrics(run) if "train_loss" in r}
    drawn = losses[0][losses[0]["curve"] == "train loss"]
    assert dict(zip(drawn["step"], drawn["loss"])) == pytest.approx(logged)
    assert sorted(logged) == [0, 5, 10, 15, 20, 25, 30]


def test_model_pages_say_what_they_need_and_dynamics_draws(start, history_only):  # noqa: F811
    at = start("mine", roots=[history_only])
    for page in ("attention", "lens", "embeddings"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception and not at.error, page
        assert any("save_every" in i.value for i in at.info), page
    at.switch_page("views/dynamics.py").run()
    assert not at.exception and not at.error
    assert len(at.get("vega_lite_chart")) >= 3  # entropy per head, u per group, the other signals
    at.switch_page("views/compare.py").run()
    assert not at.exception


def test_save_every_writes_our_snapshots_of_the_live_model(start, tmp_path):  # noqa: F811
    model, tokenizer = monitored_run(tmp_path / "saved", save_every=15)
    steps = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "saved").glob("step_*"))
    assert steps == [0, 15, 30]
    snap = load_checkpoint(tmp_path / "saved")  # the latest: the weights the loop ended with
    ids = torch.tensor([tokenizer.encode("the queen shall")])  # [1 pos]: within the context of 16
    with torch.no_grad():
        ours, theirs = snap.model(ids), model.eval()(ids)  # [1 pos vocab]
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-5 * theirs.abs().max().item())
    assert snap.step == 30 and snap.tokenizer.vocab_size == tokenizer.vocab_size
    at = start("saved", roots=[tmp_path])
    at.switch_page("views/attention.py").run()
    assert not at.exception and not at.error
    assert not any("training history only" in i.value for i in at.info)
    assert at.get("vega_lite_chart")
    assert math.isfinite(read_metrics(tmp_path / "saved")[-1]["logit_max"])
