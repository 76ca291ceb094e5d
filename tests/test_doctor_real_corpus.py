"""The run doctor on a corpus of the logs other trainers write (tests/data/doctor_logs, made by
make_corpus.py there with transformers' own Trainer and TrainerState, PyTorch's SummaryWriter under
Lightning's tag names, and llm.c's and nanoGPT's print formats). Each entry's truth was read by hand
from its curve; the verdicts before issue 36 are in the comments."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from probes import diagnose

CORPUS = Path(__file__).resolve().parent / "data" / "doctor_logs"

# name -> (verdict, finding codes, what the curve shows); the verdict before issue 36 in the comment
TRUTH = {
    # one inf grad norm at step 25 (a skipped step), loss 4.04 -> 2.24 falling through it (was: failed)
    "hf_fp16_skip": ("healthy", {"skipped_steps"}, "learns; one skipped step"),
    # lr 5 constant: loss 4.04 -> 756 by step 6, 510 at the end, never NaN (was: failed)
    "hf_lr5": ("failed", {"divergence"}, "blew up without NaN"),
    # lr 1e-9: loss 10.49 throughout, ln(50257) = 10.82 (the Trainer logs 31/32 of it) (was: warning)
    "hf_uniform": ("failed", {"uniform_loss", "plateau"}, "learns nothing"),
    # eval best at its first (4.54 at 50) rising to 9.46, train 4.06 -> 0.05 (was: failed, a 'divergence')
    "hf_overfit": ("warning", {"overfitting"}, "overfits from the first eval"),
    # linear decay to 0, loss 4.04 -> 0.57 still easing down (was: healthy)
    "hf_decayed": ("healthy", set(), "learns"),
    # 4 logged steps (was: healthy)
    "hf_short": ("too short", set(), "too short to say"),
    # a classifier: loss to ~1e-4, median norm to ~1e-3, ordinary norms of ~3 (was: warning, 'grad_spike'
    # and a plateau 'not improved by 0.005 nats' on a loss of 0.004)
    "hf_classifier": ("healthy", set(), "converged"),
    # DPO: loss ln 2 -> 0.37, flat once the margins saturate (was: healthy, plateau in nats)
    "trl_dpo": ("healthy", {"plateau"}, "learned, then flat"),
    # GRPO: loss ~0 either sign, reward 0.2 -> 0.7 (was: warning, 'plateau ... never left its initial value')
    "trl_grpo": ("healthy", set(), "reward rises; the loss says nothing"),
    # Lightning: train_loss_step every 5 steps, val_loss per epoch, 4.2 -> 1.65 (was: healthy from val_loss alone)
    "lightning_tb": ("healthy", set(), "learns"),
    # a regression's MSE 4150 -> 150 with noise of 20 (was: warning, a 1-'nat' rise in the noise)
    "regression_tb": ("healthy", set(), "learns"),
    # llm.c printing NaN from step 1 (was: error, not a nanoGPT log)
    "llmc_nan.log": ("failed", {"divergence"}, "NaN from the start"),
    # llm.c's main.log: trl 11 -> 3.3, tel alike (was: error, no history)
    "llmc_out": ("healthy", set(), "learns"),
    # train_gpt2.c's printed lines, 40 steps 5.3 -> 3.9 (was: error, not a nanoGPT log)
    "llmc_gpt2c.log": ("healthy", set(), "learns"),
    # nanoGPT shakespeare_char: val best 1.48 at 2250, then 1.83; train falls (was: warning, plus a plateau)
    "nanogpt_overfit.log": ("warning", {"overfitting"}, "overfits"),
}


def diagnosis(name: str) -> diagnose.Diagnosis:
    path = CORPUS / name
    if "tb" in name:
        pytest.importorskip("tensorboard")
    return diagnose.run(None, log=path) if path.is_file() else diagnose.run(path)


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_the_verdict_is_the_truth_read_from_the_curve(name):
    verdict, codes, _ = TRUTH[name]
    d = diagnosis(name)
    assert (d.verdict, {f.code for f in d.findings}) == (verdict, codes), d.format()


def test_the_skipped_step_is_the_one_the_trainer_logged_inf_at():
    state = json.loads((CORPUS / "hf_fp16_skip" / "trainer_state.json").read_text())
    inf = [e["step"] for e in state["log_history"] if "grad_norm" in e and not math.isfinite(e["grad_norm"])]
    skipped = next(f for f in diagnosis("hf_fp16_skip").findings if f.code == "skipped_steps")
    assert inf == [25] and skipped.step == 25 and skipped.severity == "info" and skipped.evidence["skipped"] == 1


def test_the_advice_uses_what_each_log_holds():
    lr5 = next(f for f in diagnosis("hf_lr5").findings if f.code == "divergence")
    assert "(it is 5;" in lr5.fix and "max_grad_norm" not in lr5.fix  # the Trainer clips at 1.0 already
    overfit = next(f for f in diagnosis("nanogpt_overfit.log").findings if f.code == "overfitting")
    assert "always_save_checkpoint=True" not in overfit.fix and "use ckpt.pt" in overfit.fix
    hf_overfit = next(f for f in diagnosis("hf_overfit").findings if f.code == "overfitting")
    assert "load_best_model_at_end=True" in hf_overfit.fix and "save_steps" not in hf_overfit.fix
    nan = next(f for f in diagnosis("llmc_nan.log").findings if f.code == "divergence")
    assert "first step" in nan.title and "learning rate" not in nan.fix  # no update ran before it
    grpo = diagnosis("trl_grpo").not_checked["plateau"]
    assert grpo.startswith("not judged: the loss is a policy-gradient loss") and "kl" in grpo


def test_the_lfs_pointer_is_named_as_such(capsys):
    code = diagnose.main(["--ckpt", str(CORPUS / "lfs_pointer")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1
    assert "events.out.tfevents.1700000000.host.1.0: a Git LFS pointer, not the file: run git lfs pull" in err[0]
