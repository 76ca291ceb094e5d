"""The Patching page on the shipped induction run: it opens there with a repeat and its reversed copy,
its heat map holds `probes.patching`'s normalised effects (the induction heads of layer 1 at the last
position, the previous-token heads of layer 0 where the corrupt copy misleads them), the strongest cell's
top predictions are the probe's, the ablation panel's bars are `probes.ablate`'s per-token change, and
bad input is one line in the page."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app_kit import open_app
from chart_kit import specs

INDUCTION = Path(__file__).resolve().parent.parent / "checkpoints" / "induction"
MAP = "share of the clean answer restored (heads, 1 = all of it)"
TOL = 1e-5  # the page's numbers are the probe's, run again here: float32 sums, normalised by a gap of ~6


@pytest.fixture(scope="module")
def probe_result():
    from models.checkpoint import load_checkpoint
    from probes.patching import run
    from train.repetition import page_text

    snap = load_checkpoint(INDUCTION)
    segment = page_text(snap.config.n_ctx)[:16]  # the sidebar's first text is this, twice
    clean, corrupt = segment + segment[:-1], segment[::-1] + segment[:-1]
    results = {method: run(snap.model, clean, corrupt, answer=segment[-1], wrong=segment[-3], what="heads",
                           method=method, atp_star=method == "attribution", tokenizer=snap.tokenizer)
               for method in ("attribution", "exact")}  # the page shows AtP* first, exact on request
    return snap, clean, results


def test_the_page_opens_on_the_induction_run_with_its_causal_effect(monkeypatch, probe_result):
    from probes import ablate

    snap, clean, results = probe_result
    result = results["attribution"]
    at = open_app(monkeypatch, [INDUCTION.parent / "attn1_residual", INDUCTION])
    assert at.sidebar.selectbox(key="run").value == "attn1_residual"  # the run list opens on the first run
    at.switch_page("views/patching.py").run()  # first visit, no run asked for: the showcase run
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.sidebar.selectbox(key="run").value == "induction"
    assert at.text_input(key="patch_clean").value == clean
    (spec, (cells, *_)), = specs(at, MAP)
    assert spec["params"][0]["select"]["type"] == "point"  # a click picks a cell
    shown = torch.tensor(cells["effect"].tolist()).view(result.normalised.shape)  # [layer pos head]
    assert torch.allclose(shown, result.normalised, atol=TOL)
    last = shown[1, -1]  # layer 1 at the last position: every induction head brings the answer back
    assert (last > 0.1).all() and last.max() > 0.3
    strongest = torch.unravel_index(result.normalised.abs().argmax(), result.normalised.shape)
    at.radio(key="patch_method").set_value("exact").run()  # exact on request: the probe's exact numbers
    (_, (exact, *_)), = specs(at, MAP)
    exact_shown = torch.tensor(exact["effect"].tolist()).view(shown.shape)
    assert torch.allclose(exact_shown, results["exact"].normalised, atol=TOL)
    assert torch.corrcoef(torch.stack([exact_shown.flatten(), shown.flatten()]))[0, 1] > 0.9  # AtP* tracks it
    top = at.dataframe[0].value
    want = result.top_predictions(tuple(int(i) for i in strongest))
    assert list(top["token"]) == [t["piece"] for t in want]
    assert top["probability"].tolist() == pytest.approx([t["prob"] for t in want], abs=TOL)
    # the ablation panel: its first ticks are the heads whose patch restores most; its bars are the probe's
    ticked = [(int(n[1]), int(n[3])) for n in at.multiselect[0].value]
    assert ticked and (1, int(last.argmax())) in ticked
    (_, (bars, *_)), = specs(at, "each predicted token's loss change without the ticked heads")
    direct = ablate.run(snap.model, torch.tensor([snap.tokenizer.encode(clean)]), heads=ticked)
    assert bars["change"].tolist() == pytest.approx(direct.per_token[0].tolist(), abs=TOL)


def test_bad_input_is_one_line_in_the_page(monkeypatch):
    at = open_app(monkeypatch, [INDUCTION], page="patching", run="induction")
    for box, value, said in (("patch_corrupt", "abc", "differ in shape"), ("patch_answer", "ab", "not one"),
                             ("patch_clean", "", "empty")):
        good = at.text_input(key=box).value
        at.text_input(key=box).set_value(value).run()
        assert not at.exception
        assert [e.value for e in at.error] and said in at.error[0].value and "\n" not in at.error[0].value, box
        assert not specs(at, MAP)
        at.text_input(key=box).set_value(good).run()  # back: the page draws again
        assert not at.error and specs(at, MAP)


def test_a_run_the_address_names_is_kept(monkeypatch):
    """Only a visit that asked for no run opens on the induction run; `?run=` is followed, and the
    defaults come from that run's sidebar text (Shakespeare here, newlines shown as ⏎)."""
    at = open_app(monkeypatch, [INDUCTION.parent / "attn1_residual", INDUCTION], page="patching",
                  run="attn1_residual")
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.sidebar.selectbox(key="run").value == "attn1_residual"
    assert at.text_input(key="patch_clean").value.startswith("ROMEO:⏎But")
    (_, (cells, *_)), = specs(at, MAP)
    assert set(cells["row"]) == {"L0H0"}  # its one head, by position
