"""Every logged metric in the app (AppTest on a run trained here, which logs the run doctor's newer
keys, and on a copy of a shipped run with them taken out): each new chart carries the logged values,
tokens per second is computed by hand, the smoothing slider draws TensorBoard's EMA (by hand)
in front of the raw loss, entropy can be divided by uniform's, the g/w/u table is in scientific
notation with u_nominal explained, and the embedding map says when it or the neighbours show little."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
from app_kit import open_app
from chart_kit import frames, titles


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    from probes.first_view import PAGE_TEXT
    from train.loop import main

    root = tmp_path_factory.mktemp("metric_runs")
    text = root.parent / "metric_text.txt"
    text.write_text(("the king and the queen shall not be what thou art, my good lord.\n" * 40
                     + PAGE_TEXT + "\n") * 2)
    assert main(["--preset", "transformer4_rms_small", "--out", str(root / "m_rms"), "--data", str(text), "-q",
                 "--steps", "20", "--batch-size", "8", "--log-every", "5", "--eval-every", "10",
                 "--save-every", "20"]) == 0
    return root / "m_rms"


@pytest.fixture
def start(monkeypatch):
    """start(name, page, roots=None): `page` of run `name`, on `roots` only when given."""
    return lambda name, page, roots=None: open_app(monkeypatch, roots, page, run=name)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def chart(at, title: str) -> tuple[dict, list]:
    """(spec, datasets) of the chart titled `title`."""
    for c in at.get("vega_lite_chart"):
        spec = json.loads(c.proto.spec)
        if title in titles(spec):
            return spec, frames(c)
    raise AssertionError(f"no chart titled {title!r}")


def column(at, title: str, y: str):
    _, frames = chart(at, title)
    return next(f for f in frames if y in f.columns)


def test_each_new_chart_carries_the_logged_values(start, run):
    at = start(run.name, "dynamics", roots=[run])
    logged = records(run)
    evals = [r for r in logged if "activations" in r]
    for title, y, key in (("learning rate (as scheduled)", "learning rate", "lr"),
                          ("gradient norm (before clipping)", "grad norm", "grad_norm"),
                          ("time per step", "step time (ms)", "step_time_ms"),
                          ("largest |logit| of the output", "max |logit|", "logit_max")):
        frame = column(at, title, y)
        expected = [(r["step"], r[key]) for r in logged if key in r]
        assert list(frame["step"]) == [s for s, _ in expected], title
        assert list(frame[y]) == pytest.approx([v for _, v in expected]), title
    rate = column(at, "tokens per second", "tokens/s")
    by_hand = [(b["step"], (b["tokens"] - a["tokens"]) / (b["step_time_ms"] / 1000 * (b["step"] - a["step"])))
               for a, b in zip(logged, logged[1:])]
    assert list(rate["step"]) == [s for s, _ in by_hand]
    assert list(rate["tokens/s"]) == pytest.approx([v for _, v in by_hand])
    dead = column(at, "dead MLP units", "dead share")
    hook = "blocks.1.mlp.hook_post"
    assert list(dead[dead["layer"] == "block 1 post"]["dead share"]) == pytest.approx(
        [r["activations"][hook]["dead"] for r in evals])
    heads = column(at, "largest attention score per head", "max attention logit")
    assert list(heads[(heads["layer"] == "L2") & (heads["head"] == "H3")]["max attention logit"]) == pytest.approx(
        [r["attn_logit_max"]["2"][3] for r in evals])
    spec, _ = chart(at, "largest attention score per head")
    assert spec["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    # 16 heads: a colour per head of a layer and a dash per layer, never one of 10 colours used twice
    encoding = spec["layer"][0]["encoding"]
    assert encoding["color"]["field"] == "head" and encoding["strokeDash"]["field"] == "layer"
    assert heads["head"].nunique() <= 10 and len(heads.groupby(["layer", "head"])) == heads["layer"].nunique() * heads["head"].nunique()
    rms = column(at, "residual stream rms per layer", "residual rms")
    assert list(rms[rms["layer"] == "layer 0"]["residual rms"]) == pytest.approx([r["resid_rms"]["0"] for r in evals])
    assert not any("not logged" in c.value for c in at.caption)


def test_a_run_that_predates_the_new_keys_says_so(start, tmp_path):
    import shutil
    old = tmp_path / "mha4_before_internals"  # a shipped run as it was logged before the doctor's keys
    shutil.copytree(Path(__file__).resolve().parent.parent / "checkpoints" / "mha4", old)
    lines = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    dropped = [{k: v for k, v in r.items() if k not in ("attn_logit_max", "resid_rms", "logit_max")} for r in lines]
    assert dropped != lines  # the shipped run logs them: the copy is what an older run looks like
    (old / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dropped))
    at = start(old.name, "dynamics", roots=[old])
    said = [c.value for c in at.caption if "not logged by this run" in c.value]
    assert len(said) == 3 and {s.split(":")[0] for s in said} == {
        "Largest attention score per head", "Residual stream rms per layer", "Largest |logit| of the output"}


def test_smoothing_draws_the_ema_in_front_of_the_raw_loss_and_log_y(start, run):
    at = start(run.name, "overview", roots=[run])
    spec, _ = chart(at, "loss")
    assert spec["layer"][0]["encoding"]["y"]["title"] == "loss (nats per token)"
    assert spec["layer"][0]["encoding"]["x"]["axis"]["format"] == "d"  # whole steps
    at.slider(key="loss_smoothing").set_value(0.6).run()
    at.radio(key="loss_y").set_value("log").run()
    frame = column(at, "loss", "smoothed")
    train = frame[frame["curve"] == "train loss"].sort_values("step")
    raw = [r["train_loss"] for r in records(run) if "train_loss" in r]
    assert list(train["loss"]) == pytest.approx(raw)  # the raw line, kept
    last, expected = 0.0, []
    for n, x in enumerate(raw, start=1):  # TensorBoard's debiased EMA, by hand
        last = 0.6 * last + 0.4 * x
        expected.append(last / (1 - 0.6 ** n))
    assert list(train["smoothed"]) == pytest.approx(expected)
    spec, _ = chart(at, "loss")
    layers = spec["layer"][0]["layer"]
    assert [layer["mark"].get("opacity") for layer in layers] == [0.25, None]  # raw faint, EMA in front
    assert all(layer["encoding"]["y"]["scale"]["type"] == "log" for layer in layers)


def test_entropy_divided_by_uniform_and_on_shared_axes(start, run):
    at = start(run.name, "dynamics", roots=[run])
    n_ctx = json.loads((run / "run.json").read_text())["model"]["n_ctx"]
    uniform = math.lgamma(n_ctx + 1) / n_ctx
    assert any(f"ln({n_ctx}!)/{n_ctx} = {uniform:.3f}" in c.value for c in at.caption)
    at.toggle(key="entropy_norm").set_value(True).run()
    at.toggle(key="entropy_shared").set_value(True).run()
    frame = column(at, "layer 0", "entropy / uniform")
    assert list(frame["entropy / uniform"]) == pytest.approx(list(frame["entropy (nats)"] / uniform))
    domains = {json.dumps(chart(at, f"layer {l}")[0]["layer"][0]["layer"][0]["encoding"]["y"]["scale"]["domain"])
               for l in range(4)}
    assert len(domains) == 1  # one y range for every layer


def test_the_gwu_table_is_scientific_and_explains_u_nominal(start, run):
    at = start(run.name, "dynamics", roots=[run])
    proto = at.dataframe[0].proto
    shown = pa.ipc.open_stream(proto.arrow_data.styler.display_values).read_all().to_pandas()
    for name in ("g", "w", "u", "u_nominal"):
        assert all(v == "-" or len(v.split("e")[0].replace("-", "")) == 4 for v in shown[name]), shown[name]
    assert "plain SGD" in json.loads(proto.columns)["u_nominal"]["help"]
    assert any(s.value == f"g / w / u of {run.name}" for s in at.subheader)
    assert any(m.value.startswith("At step **20**, group medians") for m in at.markdown)


def test_embeddings_say_when_the_map_or_the_neighbours_show_little(start, run):
    from models.checkpoint import load_checkpoint
    from probes import neighbours, projection
    from probes.neighbour_baseline import shuffled_baseline

    at = start(run.name, "embeddings", roots=[run])
    model = load_checkpoint(run).model
    explained = projection.run(model, "input")[1].sum().item()
    warned = any("explain only" in w.value for w in at.warning)
    assert warned == (explained < 0.2)
    base = shuffled_baseline(neighbours.input_table(model), k=10)
    near_chance = any(w.value.startswith("No more structure than chance") for w in at.warning)
    assert near_chance == (not base.structured)
    assert any(f"below {base.shuffled_level:.2f}" in m.value for m in [*at.warning, *at.caption])
    points = next(f for c in at.get("vega_lite_chart") for f in
                  [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in c.proto.datasets]
                  if "side" in f.columns)
    assert points.loc[points["role"] != "other", "side"].notna().all()  # the chosen token and its neighbours


def test_mlp_share_charts_name_lines_on_top_of_each_other_and_a_relus_zeros(start, tmp_path):
    import shutil
    shipped = Path(__file__).resolve().parent.parent / "checkpoints"
    at = start("shakespeare_gpt", "dynamics", roots=[shipped / "shakespeare_gpt"])  # a ReLU GPT, 4 MLP layers
    spec, frames_ = chart(at, "dead MLP units")
    dead = next(f for f in frames_ if "dead share" in f.columns)
    assert dead["layer"].nunique() == 4 and dead["dead share"].max() < 1 / 200  # all within a pixel of 0
    title = next(node["title"] for node in [spec, *spec.get("layer", [])] if isinstance(node.get("title"), dict))
    assert title["subtitle"] == "all 4 layers on one line, at 0"  # before: one colour, and no word of the others
    spec, frames_ = chart(at, "zero ReLU outputs (sparse, not saturated)")
    assert spec["layer"][0]["encoding"]["y"]["title"] == "share of ReLU outputs at 0"
    assert not [c for c in at.get("vega_lite_chart") if "saturated MLP activations" in titles(json.loads(c.proto.spec))]
    gelu = tmp_path / "mha4_gelu"  # the same records told as a GELU model's: its flat part is saturation
    shutil.copytree(shipped / "mha4", gelu, ignore=shutil.ignore_patterns("step_*"))
    info = json.loads((gelu / "run.json").read_text())
    info["model"]["act_fn"] = "gelu"
    (gelu / "run.json").write_text(json.dumps(info))
    at = start(gelu.name, "dynamics", roots=[gelu])
    spec, _ = chart(at, "saturated MLP activations")
    assert spec["layer"][0]["encoding"]["y"]["title"] == "share of activations"
