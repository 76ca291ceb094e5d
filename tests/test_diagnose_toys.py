"""One toy run per rule of the run doctor, trained here in seconds with a setting that causes it
(the series' own failures: no sqrt(d), no norm, a learning rate far too high or too low, a tiny
text), each found by its own rule, and its healthy twin not warned about by that rule."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from probes import diagnose
from train.loop import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train import tiny_text  # noqa: E402

ORDER = ("info", "warning", "failed")
COMMON = ["--batch-size", "16", "--log-every", "1", "--eval-every", "2", "--save-every", "0", "-q",
          "--no-progress"]
HEALTHY = ["--preset", "transformer4_rms_small", "--optimizer", "adamw", "--lr", "3e-3", "--steps", "40"]
TOYS = {  # name: (train flags, text)
    "no_scale": (["--preset", "attn1_noscale_small", "--set", "d_model=128", "--set", "d_head=128",
                  "--steps", "20"], "long"),
    "residual": (["--preset", "attn1_residual_small", "--set", "d_model=128", "--set", "d_head=128",
                  "--steps", "20"], "long"),
    "no_norm_lr": (["--preset", "transformer4_small", "--optimizer", "sgd", "--lr", "0.5", "--steps", "40"], "long"),
    "rms_lr": (["--preset", "transformer4_rms_small", "--optimizer", "sgd", "--lr", "0.5", "--steps", "30",
                "--keep-going"], "long"),
    "rms_lr10": (["--preset", "transformer4_rms_small", "--optimizer", "sgd", "--lr", "10", "--steps", "20"], "long"),
    "no_norm_init": (["--preset", "transformer4_small", "--optimizer", "sgd", "--lr", "1e-4", "--steps", "10"], "long"),
    "healthy": (HEALTHY, "long"),
    "lr_1e-9": (["--preset", "transformer4_rms_small", "--optimizer", "sgd", "--lr", "1e-9", "--steps", "40"], "long"),
    "mlp_lr": (["--preset", "char_mlp_small", "--optimizer", "sgd", "--lr", "3", "--steps", "40"], "long"),
    "mlp": (["--preset", "char_mlp_small", "--steps", "40"], "long"),
    "tanh_lr": (["--preset", "char_mlp_small", "--set", "act_fn=tanh", "--optimizer", "sgd", "--lr", "3",
                 "--steps", "40"], "long"),
    "tanh": (["--preset", "char_mlp_small", "--set", "act_fn=tanh", "--steps", "40"], "long"),
    "tiny_text": (["--preset", "transformer4_rms_small", "--set", "n_ctx=8", "--optimizer", "adamw",
                   "--lr", "1e-2", "--steps", "200", "--eval-every", "10", "--log-every", "10"], "short"),
    "long_text": (["--preset", "transformer4_rms_small", "--set", "n_ctx=8", "--optimizer", "adamw",
                   "--lr", "1e-2", "--steps", "200", "--eval-every", "10", "--log-every", "10"], "long"),
}
# rule code, the toy that causes it, the severity it must reach there, its healthy twin
CASES = [
    ("attention_collapse", "no_scale", "failed", "residual"),
    ("divergence", "no_norm_lr", "failed", "healthy"),
    ("grad_spike", "rms_lr", "warning", "healthy"),
    ("init_loss_high", "no_norm_init", "warning", "healthy"),
    ("attn_logit_growth", "rms_lr10", "warning", "healthy"),
    ("output_logit_growth", "rms_lr10", "warning", "healthy"),
    ("slow_qk", "no_scale", "warning", "residual"),
    ("update_ratio_high", "mlp_lr", "warning", "mlp"),
    ("update_ratio_low", "lr_1e-9", "warning", "healthy"),
    ("plateau", "lr_1e-9", "warning", "healthy"),
    ("dead_units", "mlp_lr", "warning", "mlp"),
    ("saturated_units", "tanh_lr", "warning", "tanh"),
    ("overfitting", "tiny_text", "warning", "long_text"),
]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toys")
    texts = {"long": root / "long.txt", "short": root / "short.txt"}
    texts["long"].write_text(tiny_text(), encoding="utf-8")
    texts["short"].write_text(tiny_text(300, seed=1), encoding="utf-8")  # 200-odd characters to train on
    done: dict[str, Path] = {}

    def run(name: str) -> Path:
        if name not in done:
            flags, text = TOYS[name]
            out = root / name
            rc = main(["--data", str(texts[text]), "--out", str(out), *COMMON, *flags])
            assert rc in (0, 3), f"{name}: train exited {rc}"
            done[name] = out
        return done[name]

    return run


def severities(d: diagnose.Diagnosis, code: str) -> list[str]:
    return [f.severity for f in d.findings if f.code == code]


@pytest.mark.parametrize("code, name, severity, twin", CASES, ids=[c[0] for c in CASES])
def test_each_rule_finds_its_toy_and_not_its_healthy_twin(code, name, severity, twin, toy):
    found = diagnose.run(toy(name))
    assert severity in severities(found, code), [(f.code, f.severity) for f in found.findings]
    calm = diagnose.run(toy(twin))
    assert not any(ORDER.index(s) >= ORDER.index("warning") for s in severities(calm, code))
    assert calm.verdict != "failed"


def test_toy_divergence_is_warned_about_before_its_first_nonfinite_step(toy):
    run = toy("no_norm_lr")
    div = [f for f in diagnose.run(run).findings if f.code == "divergence"][0]
    bad = div.evidence["first_nonfinite_step"]
    assert div.warning_step is not None and div.warning_step < bad
    early = diagnose.run(run, step=bad - 1)
    assert early.verdict != "failed" and any(f.severity == "warning" for f in early.findings)


def test_training_prints_the_diagnosis_when_it_stops_and_new_findings_once(toy, tmp_path, caplog):
    caplog.set_level("INFO", logger="train")
    flags, _ = TOYS["no_norm_lr"]
    rc = main(["--data", str(toy("healthy").parent / "long.txt"), "--out", str(tmp_path / "r"), *COMMON,
               *flags, "--diagnose-every", "1"])
    assert rc == 3
    lines = [r.getMessage() for r in caplog.records]
    live = [l for l in lines if l.startswith("doctor: [")]
    assert len(live) == len(set(live)) >= 1  # each new finding once
    final = [i for i, l in enumerate(lines) if l.startswith("doctor: failed")]
    error = [i for i, l in enumerate(lines) if l.startswith("training diverged")]
    assert final and error and final[0] < error[0]  # the diagnosis beside the divergence message
    assert any("[failed] divergence" in l for l in lines[final[0]:])
