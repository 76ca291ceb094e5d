"""The Embeddings page's verdict on its neighbours (AppTest on the shipped runs, issue 29 item 11):
it compares the table with its dimension-shuffled copies (`probes.neighbour_baseline`), warns where
a table is no more structured than those (an untrained, step-0 table) and only there, and says what
it compared."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.store import load_checkpoint
from probes import neighbours
from probes.neighbour_baseline import shuffled_baseline

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "app" / "main.py"
SHIPPED = REPO / "checkpoints"
WARNING = "No more structure than chance"


@pytest.fixture
def embeddings(monkeypatch):
    """embeddings(run, table, snapshot=None, roots=None, token=None): the page on a shipped run (or
    one under `roots`), that table and token chosen."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()  # caches outlive an AppTest

    def open_page(run: str, table: str = "input", snapshot: str | None = None, roots: Path | None = None,
                  token: str | None = None):
        if roots is not None:
            monkeypatch.setenv("SCRATCHSCOPE_RUNS", str(roots))
            monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")
        at = AppTest.from_file(str(APP), default_timeout=180)
        at.query_params.update({"run": run, **({"snapshot": snapshot} if snapshot else {})})
        at.run()
        at.switch_page("views/embeddings.py").run()
        if table != "input":
            at.selectbox(key="table").set_value(table).run()
        if token is not None:
            at.text_input(key="token").set_value(token).run()
        assert not at.exception, [e.value for e in at.exception]
        return at
    return open_page


def baseline(snapshot: Path, table: str):
    return shuffled_baseline(neighbours.tables_for(load_checkpoint(snapshot).model, table)[0], k=10)


def test_a_step_0_unembedding_is_warned_about_and_the_trained_one_is_not(embeddings):
    at = embeddings("shakespeare_rms4", "output", snapshot="step_000000")
    warned = [w.value for w in at.warning if w.value.startswith(WARNING)]
    assert len(warned) == 1 and "shuffled across tokens" in warned[0]
    expected = baseline(SHIPPED / "shakespeare_rms4" / "step_000000", "output")
    assert f"{expected.table_median:.2f} for the median token" in warned[0]
    at = embeddings("shakespeare_rms4", "output")  # the latest snapshot
    assert not any(w.value.startswith(WARNING) for w in at.warning)
    trained = baseline(sorted((SHIPPED / "shakespeare_rms4").glob("step_*[0-9]"))[-1], "output")
    said = [c.value for c in at.caption if c.value.startswith("Compared with chance")]
    assert len(said) == 1 and f"95% of tokens below {trained.shuffled_level:.2f}" in said[0]


def test_the_gpt_default_token_is_not_called_near_chance(embeddings):
    at = embeddings("shakespeare_gpt")  # 'e' in the input embedding: the page as it opens
    assert not any(w.value.startswith((WARNING, "Near chance")) for w in at.warning)
    assert any(c.value.startswith("Compared with chance") for c in at.caption)


def hand_built(root: Path, name: str, clustered: bool) -> Path:
    """The character MLP with its input embedding set by hand: capitals, lower case and the rest
    each near their own centre (random orthogonal directions of length 3, noise 0.3), or every row
    an independent draw."""
    from models import build_model, get_preset
    from models.store import save_snapshot
    from models.tokenizers import CharTokenizer

    chars = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    model = build_model(get_preset("char_mlp"))
    d = model.embedding.weight.shape[1]
    g = torch.Generator().manual_seed(0)
    group = torch.tensor([0 if c.isupper() else 1 if c.islower() else 2 for c in chars])
    centres = 3.0 * torch.linalg.qr(torch.randn(d, d, generator=g))[0][:3]
    table = centres[group] + 0.3 * torch.randn(len(chars), d, generator=g) if clustered else \
        torch.randn(len(chars), d, generator=g)
    with torch.no_grad():
        model.embedding.weight.copy_(table)
    return save_snapshot(root / name, model, CharTokenizer.from_text(chars))


def test_a_hand_built_table_warns_only_when_its_rows_are_independent(embeddings, tmp_path):
    hand_built(tmp_path, "clustered", True)
    hand_built(tmp_path, "independent", False)
    at = embeddings("clustered", roots=tmp_path, token="A")
    shown = list(at.dataframe[0].value["token"])
    assert len(shown) == 10 and all(t.isupper() for t in shown)  # its ten nearest: capitals, as built
    assert not any(w.value.startswith(WARNING) for w in at.warning)
    assert any(c.value.startswith("Compared with chance") for c in at.caption)
    at = embeddings("independent", roots=tmp_path, token="A")
    assert any(w.value.startswith(WARNING) for w in at.warning)


def test_the_page_opens_on_the_table_that_has_structure(monkeypatch):
    """shakespeare_rms4's input table stays at its random init (shuffled level); its unembedding
    does not: the page opens there instead of on a 'no more structure than chance' warning."""
    from app_kit import open_app

    at = open_app(monkeypatch, page="embeddings", run="shakespeare_rms4")
    assert at.selectbox(key="table").value == "output"
    assert not any(WARNING in w.value for w in at.warning)
    snap = load_checkpoint(SHIPPED / "shakespeare_rms4")
    queries, _ = neighbours.tables_for(snap.model, "input")
    assert not shuffled_baseline(queries, None, 10).structured  # why it did not open on the input table
