"""The app on a tutorial GPT trained in a plain loop with the Monitor and `save_every` (a snapshot of
any model): every model page opens without the user's code, drawn from what the snapshot saved;
started with `--model-code` (here its environment variable) the pages read the sidebar's text with
the model rebuilt from that code. One browser test: the Attention page draws its grid."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gpt_kit import SplitGPT
from app_kit import open_app
from browser_kit import browser, serve  # noqa: F401 - fixtures

from models.store import load_checkpoint
from models.tokenizers import CharTokenizer
from probes import degenerate
from probes.common import saved_sample
from train.monitor import Monitor

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun."
CODE = Path(__file__).resolve().parent / "gpt_kit" / "tutorial.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """runs/tutorial: a SplitGPT trained 6 steps on the text, a snapshot every 3."""
    root = tmp_path_factory.mktemp("runs")
    tokenizer = CharTokenizer.from_text(TEXT)
    ids = torch.tensor(tokenizer.encode(TEXT * 3))  # [n]
    windows = ids[: 4 * 33].view(4, 33)  # [batch ctx+1]
    torch.manual_seed(0)
    model = SplitGPT(vocab=tokenizer.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with Monitor(model, optimizer, root / "tutorial", log_every=1, eval_every=3, save_every=3, report=False,
                 eval_tokens=windows[:2, :32], tokenizer=tokenizer, model_args={"vocab": tokenizer.vocab_size}) as m:
        for step in range(7):
            logits, loss = model(windows[:, :-1], windows[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            m.log(step, train_loss=loss.item())
    return root


def errors(at) -> list[str]:
    """Exceptions and error boxes, the doctor's verdict on so short a run left out."""
    return [e.value for e in at.exception] + [e.value for e in at.error if not e.value.startswith("Verdict")]


def test_every_model_page_opens_on_what_the_snapshot_saved(runs, monkeypatch):
    at = open_app(monkeypatch, [runs], run="tutorial")
    snap = load_checkpoint(runs / "tutorial")
    row = saved_sample(snap)[0][:1]  # [1 32]: what the pages read
    for name, charts in (("overview", 1), ("attention", 6), ("embeddings", 1), ("lens", 2), ("compare", 5)):
        at.switch_page(f"views/{name}.py").run()
        assert not errors(at), (name, errors(at))
        assert len(at.get("vega_lite_chart")) >= charts, name
        said = [i.value for i in at.info if "saved without its code" in i.value]
        assert len(said) == (name in ("overview", "attention", "lens")), (name, said)
        assert not said or "-- --model-code path/to/your_file.py:SplitGPT" in said[0]
    at.switch_page("views/attention.py").run()
    grid = at.session_state["layer"], at.session_state["head"]
    shown = at.markdown[[i for i, m in enumerate(at.markdown) if m.value.startswith("**L")][0]].value
    expected = degenerate.run(snap.model, row)
    assert shown.startswith(f"**L{grid[0]}H{grid[1]}: `{expected.verdicts[grid[0]][grid[1]]}`**")
    assert f"entropy {expected.evidence['entropy'][grid[0]][grid[1]]:.3f} nats" in shown


def test_with_the_users_word_the_pages_read_the_sidebars_text(runs, monkeypatch):
    monkeypatch.setenv("SCRATCHSCOPE_MODEL_CODE", f"{CODE}:SplitGPT")
    at = open_app(monkeypatch, [runs], run="tutorial", page="attention")
    assert not errors(at) and not [i for i in at.info if "saved without its code" in i.value]
    snap = load_checkpoint(runs / "tutorial", model_code=f"{CODE}:SplitGPT")
    ids = torch.tensor([snap.tokenizer.encode(at.sidebar.text_area[0].value)[:32]])
    expected = degenerate.run(snap.model, ids)
    shown = [m.value for m in at.markdown if m.value.startswith("**L0H0")][0]
    assert shown.startswith(f"**L0H0: `{expected.verdicts[0][0]}`**")
    at.switch_page("views/overview.py").run()  # it writes: its own forward, sampled
    assert not errors(at) and len(at.code) == 2
    assert F.softmax(snap.model(ids)[0], -1).shape[-1] == snap.tokenizer.vocab_size


@pytest.mark.browser
def test_the_attention_page_of_a_tutorial_gpt_draws_its_grid(runs, browser):  # noqa: F811
    with serve({"SCRATCHSCOPE_RUNS": str(runs), "SCRATCHSCOPE_NO_SHIPPED": "1"}) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{url}/attention?run=tutorial", timeout=120_000)
        page.get_by_role("heading", name="Attention").first.wait_for(timeout=120_000)
        page.wait_for_function("document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
                               "[data-testid=\"stVegaLiteChart\"] svg').length >= 6", timeout=120_000)
        page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.get_by_text("saved without its code", exact=False).count() >= 1
        assert page.get_by_text("normalised entropy and verdict per head", exact=False).count() >= 1
        page.close()
