"""The run doctor (`probes.diagnose`) on the shipped runs, on hand-made histories whose answers
follow from their numbers, and its command line's bad input. Toy training runs, one per rule,
are in tests/test_diagnose_toys.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from models.store.run import read_metrics
from probes import diagnose
from probes.doctor.thresholds import DoctorThresholds

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = REPO_ROOT / "checkpoints"


def codes(d: diagnose.Diagnosis, at_least: str = "info") -> list[str]:
    order = ("info", "warning", "failed")
    return [f.code for f in d.findings if order.index(f.severity) >= order.index(at_least)]


def finding(d: diagnose.Diagnosis, code: str) -> diagnose.Finding:
    found = [f for f in d.findings if f.code == code]
    assert found, f"no {code} finding among {codes(d)}"
    return found[0]


def first_nonfinite_step(records: list[dict]) -> int:
    """Independently of the doctor: the first record with a null loss or entropy."""
    for r in records:
        entropies = [v for heads in (r.get("attn_entropy") or {}).values() for v in heads]
        if any(k in r and r[k] is None for k in ("train_loss", "val_loss")) or None in entropies:
            return r["step"]
    raise AssertionError("no non-finite record")


# ------------------------------------------------------------------ the shipped runs

def test_attn1_noscale_first_finding_is_collapse_with_the_sqrt_d_fix():
    d = diagnose.run(CHECKPOINTS / "attn1_noscale")
    first = d.findings[0]
    assert first.code == "attention_collapse" and d.verdict == "failed"
    assert "scale the scores by 1/sqrt(d)" in first.fix
    logged = read_metrics(CHECKPOINTS / "attn1_noscale")[-1]["attn_entropy"]["0"][0]
    assert first.evidence["lowest_entropy_nats"] == pytest.approx(logged)


def test_transformer4_nan_names_divergence_first_nonfinite_step_and_initial_loss():
    records = read_metrics(CHECKPOINTS / "transformer4_nan")
    d = diagnose.run(CHECKPOINTS / "transformer4_nan")
    div = finding(d, "divergence")
    assert div.severity == "failed" and d.verdict == "failed"
    assert div.step == div.evidence["first_nonfinite_step"] == first_nonfinite_step(records)
    assert div.warning_step is not None and div.warning_step < div.step
    assert "normalise (RMSNorm" in div.fix and "lower the learning rate" in div.fix
    init = finding(d, "init_loss_high")
    assert init.evidence["expected_ln_vocab"] == pytest.approx(math.log(65))
    assert init.evidence["initial_loss"] == pytest.approx(records[0]["val_loss"])
    assert init.evidence["excess_nats"] > 3 and init.severity == "warning"


def test_shakespeare_rms4_names_slow_qk_in_orders_of_magnitude_and_adam():
    d = diagnose.run(CHECKPOINTS / "shakespeare_rms4")
    slow = finding(d, "slow_qk")
    assert slow.severity == "warning" and "orders of magnitude" in slow.title
    assert 0.75 <= slow.evidence["gap_orders"] < 1.5  # README: about an order of magnitude
    assert slow.evidence["gap_orders"] == pytest.approx(slow.evidence["mlp_log10_u"] - slow.evidence["qk_log10_u"],
                                                        abs=0.2)
    assert "Adam" in slow.fix and slow.where[0].startswith("blocks.0")


def test_char_mlp_is_a_sparse_relu_layer_not_dead_units_and_gets_no_fix_for_it():
    d = diagnose.run(CHECKPOINTS / "char_mlp")
    last = [r for r in read_metrics(CHECKPOINTS / "char_mlp") if r.get("activations")][-1]["activations"]
    assert last["mlp.hook_post"]["dead"] < DoctorThresholds().dead_info  # no unit dead over the sample
    assert "dead_units" not in codes(d)
    sparse = finding(d, "sparse_units")
    assert sparse.evidence["zero_share"] == pytest.approx(last["mlp.hook_post"]["saturated"])
    assert sparse.severity == "info" and sparse.fix == "" and "dead" not in sparse.title.split("(")[0]
    assert f"{last['mlp.hook_post']['saturated']:.0%} of its ReLU outputs are zero" in sparse.title
    assert all(f.code != "sparse_units" for found in d.fixes_with_sources().values() for f in found)
    assert "[sparse_units;" not in d.format()  # no what-to-try line names it
    assert not any("Kaiming" in fix or "units alive" in fix for fix in d.fixes())


@pytest.mark.parametrize("run", ["attn1_residual", "shakespeare_rms4_adam", "shakespeare_gpt"])
def test_healthy_shipped_runs_have_no_finding_above_info(run):
    d = diagnose.run(CHECKPOINTS / run)
    assert d.verdict == "healthy" and codes(d, "warning") == []


@pytest.mark.parametrize("run", sorted(p.parent.name for p in CHECKPOINTS.glob("*/run.json")))  # not the sweep
def test_every_shipped_run_is_diagnosed_with_ranked_json_ready_findings(run):
    d = diagnose.run(CHECKPOINTS / run)
    order = ("failed", "warning", "info")
    ranks = [(order.index(f.severity), f.step) for f in d.findings]
    assert ranks == sorted(ranks)
    assert json.loads(json.dumps(d.to_dict()))["verdict"] == d.verdict
    for f in d.findings:
        assert f.cause and f.reference and f.evidence and (f.fix or f.severity == "info")


def test_step_before_the_failure_gives_the_warning_not_the_failure():
    records = read_metrics(CHECKPOINTS / "transformer4_nan")
    bad = first_nonfinite_step(records)
    early = diagnose.run(CHECKPOINTS / "transformer4_nan", step=bad - 2)
    assert early.verdict == "warning" and codes(early, "failed") == []
    div = finding(early, "divergence")
    assert div.severity == "warning" and div.warning_step < bad and early.last_step == bad - 2


def test_a_snapshot_path_reads_the_run_up_to_that_snapshot():
    d = diagnose.run(CHECKPOINTS / "shakespeare_rms4" / "step_001000")
    assert d.last_step == 1000 and d.upto == 1000


# ------------------------------------------------------------------ hand-made histories

def write_run(root: Path, records: list[dict], model: dict | None = None, train: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    info = {"model": {"family": "transformer", "d_vocab": 65, "n_ctx": 16, **(model or {})},
            "train": {"optimizer": "sgd", "lr": 0.1, "steps": records[-1]["step"], **(train or {})}}
    (root / "run.json").write_text(json.dumps(info))
    return root


def gwu(qk_u: float, mlp_u: float, blocks: int = 2) -> dict:
    row = lambda u: {"g": 1e-3, "w": 0.1, "u": u, "u_nominal": u}  # noqa: E731
    table = {}
    for b in range(blocks):
        table[f"blocks.{b}.attention.heads.0.W_Q"] = row(qk_u)
        table[f"blocks.{b}.attention.heads.0.W_K"] = row(qk_u)
        table[f"blocks.{b}.mlp.net.0.weight"] = row(mlp_u)
    return table


def test_slow_qk_gap_is_the_log_ratio_of_the_update_ratios(tmp_path):
    records = [{"step": s, "train_loss": 3.0 - s / 100, "gwu": gwu(1e-4, 2e-3)} for s in range(10, 110, 10)]
    d = diagnose.run(write_run(tmp_path / "sgd", records))
    slow = finding(d, "slow_qk")
    assert slow.evidence["gap_orders"] == pytest.approx(math.log10(2e-3 / 1e-4))
    adam = diagnose.run(write_run(tmp_path / "adam", [{**r, "gwu": gwu(1e-3, 2e-3)} for r in records]))
    assert "slow_qk" not in codes(adam)


def test_update_ratio_rules_follow_the_band(tmp_path):
    high = [{"step": s, "gwu": gwu(0.1, 0.1)} for s in range(1, 7)]
    frozen = [{"step": s, "gwu": gwu(0.0, 1e-3)} for s in range(1, 7)]
    assert finding(diagnose.run(write_run(tmp_path / "h", high)), "update_ratio_high").severity == "warning"
    low = finding(diagnose.run(write_run(tmp_path / "f", frozen)), "update_ratio_low")
    assert low.severity == "warning" and low.evidence["frozen"] == 4


def test_attention_and_output_logit_growth_need_ten_fold_and_a_large_value(tmp_path):
    grow = lambda s: {"0": [1.0 * 1.5 ** s, 1.0], "1": [2.0, 2.0]}  # noqa: E731
    records = [{"step": s, "val_loss": 3.0, "attn_logit_max": grow(s), "logit_max": 3.0 * 1.5 ** s}
               for s in range(0, 12)]
    d = diagnose.run(write_run(tmp_path / "g", records))
    attn = finding(d, "attn_logit_growth")
    assert attn.where == ("L0H0",) and attn.step == 6  # 1.5**6 = 11.4: ten-fold and above 10
    out = finding(d, "output_logit_growth")
    assert out.step == 6 and out.evidence["peak"] == pytest.approx(3.0 * 1.5 ** 11)
    calm = [{**r, "attn_logit_max": {"0": [5.0, 5.0]}, "logit_max": 8.0} for r in records]
    assert {"attn_logit_growth", "output_logit_growth"}.isdisjoint(codes(diagnose.run(write_run(tmp_path / "c", calm))))


def test_overfitting_names_the_best_snapshot(tmp_path):
    val = [3.0, 2.0, 1.5, 1.6, 1.8]
    records = [{"step": 100 * i, "val_loss": v, "train_loss": 3.0 - 0.5 * i} for i, v in enumerate(val)]
    run = write_run(tmp_path / "o", records)
    for step in (100, 200, 400):
        (run / f"step_{step:06d}").mkdir()
        (run / f"step_{step:06d}" / "config.json").write_text("{}")
    over = finding(diagnose.run(run), "overfitting")
    assert over.step == 200 and over.evidence["best_snapshot"] == "step_000200"
    assert "step_000200" in over.fix


def test_dead_units_and_a_sparse_relu_layer_are_told_apart(tmp_path):
    layers = {"mlp.hook_post": {"dead": 0.0, "saturated": 0.9},      # sparse: every unit fires somewhere
              "mlp.hook_post_1": {"dead": 0.3, "saturated": 0.95},   # dead: 30% of units never fire
              "mlp.hook_post_2": {"dead": 0.05, "saturated": 0.5}}   # neither
    records = [{"step": s, "train_loss": 3.0 - s / 100, "activations": layers} for s in range(0, 60, 10)]
    d = diagnose.run(write_run(tmp_path / "r", records, model={"family": "mlp", "act_fn": "relu"}))
    dead, sparse = finding(d, "dead_units"), finding(d, "sparse_units")
    assert dead.where == ("mlp.hook_post_1",) and dead.severity == "warning"
    assert dead.title.startswith("mlp.hook_post_1: 30% of units dead")
    assert sparse.where == ("mlp.hook_post",) and sparse.severity == "info" and sparse.fix == ""
    assert "every unit is active" in sparse.title and d.fixes() == [dead.fix]
    from train.doctor import finding_line  # the live doctor's line during training
    assert "try:" not in finding_line(sparse) and finding_line(dead).endswith(f"; try: {dead.fix}")
    none_dead = diagnose.run(write_run(tmp_path / "s", [{**r, "activations": {"mlp.hook_post": layers["mlp.hook_post"]}}
                                                        for r in records], model={"family": "mlp", "act_fn": "relu"}))
    assert "dead_units" not in codes(none_dead) and none_dead.fixes() == []


def test_thresholds_are_one_frozen_dataclass():
    t = DoctorThresholds()
    with pytest.raises(Exception):
        t.collapse_fraction = 0.5  # type: ignore[misc]
    strict = diagnose.run(CHECKPOINTS / "shakespeare_rms4", thresholds=DoctorThresholds(slow_qk_orders=2.0))
    assert "slow_qk" not in codes(strict)


# ------------------------------------------------------------------ bad input and the CLI

def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probes.diagnose", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)


def test_cli_prints_ranked_findings_and_what_to_try():
    out = cli("--ckpt", "checkpoints/transformer4_nan")
    assert out.returncode == 0, out.stderr
    assert "FAILED" in out.stdout and "what to try:" in out.stdout and "divergence" in out.stdout


def test_cli_json_equals_to_dict_and_fail_on_sets_the_exit_code():
    out = cli("--ckpt", "checkpoints/attn1_noscale", "--json")
    assert json.loads(out.stdout) == diagnose.run("checkpoints/attn1_noscale").to_dict()
    assert cli("--ckpt", "checkpoints/attn1_noscale", "--fail-on", "failed").returncode == 1
    assert cli("--ckpt", "checkpoints/shakespeare_rms4", "--fail-on", "failed").returncode == 0
    assert cli("--ckpt", "checkpoints/shakespeare_rms4", "--fail-on", "warning").returncode == 1


@pytest.mark.parametrize("case", ["missing", "empty_dir", "a_file", "no_records", "garbage_only"])
def test_unusable_input_is_one_line_and_exit_2(case, tmp_path):
    path = tmp_path / "run"
    if case == "empty_dir":
        path.mkdir()
    elif case == "a_file":
        path.write_text("not a run")
    elif case in ("no_records", "garbage_only"):
        path.mkdir()
        (path / "run.json").write_text("{}")
        (path / "metrics.jsonl").write_text("" if case == "no_records" else "{not json\n")
    out = cli("--ckpt", str(path))
    assert out.returncode == 2 and out.stdout == ""
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr


def test_half_written_last_line_is_skipped_and_the_rest_diagnosed(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    text = (CHECKPOINTS / "transformer4_nan" / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text + '{"step": 6, "train_lo')
    (run / "run.json").write_text((CHECKPOINTS / "transformer4_nan" / "run.json").read_text())
    out = cli("--ckpt", str(run))
    assert out.returncode == 0 and "truncated last line" in out.stderr and "Traceback" not in out.stderr
    assert diagnose.run(run).to_dict()["findings"] == diagnose.run(CHECKPOINTS / "transformer4_nan").to_dict()["findings"]


def test_a_run_without_evals_or_new_keys_says_what_was_not_checked(tmp_path):
    records = [{"step": s, "train_loss": 3.0 - s / 50, "grad_norm": 1.0} for s in range(1, 6)]
    d = diagnose.run(write_run(tmp_path / "r", records))
    assert d.verdict == "too short" and "too short to judge: 5 logged losses" in d.format()  # 5 points: not "healthy"
    assert d.not_checked["overfitting"].startswith("not enough data")
    assert d.not_checked["attn_logit_growth"].startswith("not logged")
    assert d.not_checked["init_loss_high"].startswith("not enough data")
    shipped = read_metrics(CHECKPOINTS / "shakespeare_gpt")  # as a run logged before the doctor's keys
    before = [{k: v for k, v in r.items() if k not in ("attn_logit_max", "resid_rms", "logit_max")} for r in shipped]
    assert before != shipped
    info = json.loads((CHECKPOINTS / "shakespeare_gpt" / "run.json").read_text())
    old = diagnose.run(write_run(tmp_path / "old", before, model=info["model"], train=info["train"]))
    assert {"attn_logit_growth", "output_logit_growth"} <= set(old.not_checked)
    assert not {"attn_logit_growth", "output_logit_growth"} & set(diagnose.run(CHECKPOINTS / "shakespeare_gpt").not_checked)


def test_step_before_the_first_record_is_one_line(tmp_path):
    run = write_run(tmp_path / "r", [{"step": s, "train_loss": 2.0} for s in range(5, 8)])
    with pytest.raises(ValueError, match="no records at or before step 2"):
        diagnose.run(run, step=2)


def test_the_findings_words_fit_what_they_name():
    """Issue 58, item 6: "1 head's" (it read "1 head'"), the first-layer reassurance only of a first
    layer's uniform heads (it was said of the last layer too)."""
    from types import SimpleNamespace

    from probes.doctor.rules_development import collapse_finding
    from probes.doctor.rules_internals import uniform_finding

    def change(heads):
        per_head = [{"layer": l, "head": h, "before": 0.9, "after": 0.1, "range": 0.8, "step": 30} for l, h in heads]
        return {"kind": "entropy_collapse", "step": 30, "heads": heads,
                "evidence": {"from_step": 20, "to_step": 40, "per_head": per_head}}
    assert collapse_finding(change([[1, 0]]), set(), 0.0).title.startswith("1 head's attention entropy")
    assert collapse_finding(change([[1, 0], [1, 1]]), set(), 0.0).title.startswith("2 heads' attention entropy")
    timeline = SimpleNamespace(uniform={0: {0: 10}, 3: {1: 10}}, uniform_nats=2.0, thresholds={"uniform": 0.95})
    assert uniform_finding(timeline, [(0, 0)]).fix.startswith("often harmless in a first layer")
    assert "first layer" not in uniform_finding(timeline, [(3, 1)]).fix
