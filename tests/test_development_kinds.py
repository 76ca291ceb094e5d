"""probes.development on the other kinds of run the store opens as a sequence of snapshots: a
folder of nanoGPT checkpoint files, a folder of Hugging Face Trainer checkpoint-N directories, and
the Monitor's snapshots of a model saved without its code (read from what it saved)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from models.checkpoint import load_checkpoint
from probes import development, entropy, heads
from probes.common import saved_sample

TOKENS = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(3))
# both sides read float32 patterns of the same weights on the same tokens, summed in another order
TOL = 1e-5


def close(got, want, tol: float = TOL) -> None:
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
                               atol=tol, rtol=0)


def test_a_folder_of_nanogpt_checkpoints(tmp_path):
    from nanogpt_ref import GPT, GPTConfig, save_like_nanogpt

    for i, step in enumerate((100, 200, 300)):
        torch.manual_seed(i)
        save_like_nanogpt(GPT(GPTConfig(vocab_size=40)), tmp_path / f"ckpt_{step}.pt", iter_num=step)
    result = development.run(tmp_path, tokens=TOKENS)
    assert [s["step"] for s in result.snapshots] == [100, 200, 300]
    assert (tmp_path / "ckpt_200.development.json").is_file()
    model = load_checkpoint(tmp_path / "ckpt_200.pt").model
    by_probe = heads.run(model, TOKENS, copying=False).scores["previous_token"]
    close(result.snapshots[1]["scores"]["previous_token"], by_probe)
    assert all(s["repeat_loss"] is not None and s["lens_kl"] for s in result.snapshots)


def test_a_folder_of_hugging_face_trainer_checkpoints(tmp_path):
    pytest.importorskip("transformers")
    from hf_dir_kit import save_hf_dir

    for seed, step in enumerate((10, 20)):
        save_hf_dir(tmp_path / f"checkpoint-{step}", seed=seed)
    history = [{"step": 10, "loss": 2.0, "learning_rate": 1e-3}, {"step": 20, "loss": 1.5, "learning_rate": 1e-3}]
    state = {"global_step": 20, "log_history": history}
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text(json.dumps(state))
    tokens = TOKENS % 32
    result = development.run(tmp_path, tokens=tokens)
    assert [s["step"] for s in result.snapshots] == [10, 20]
    assert result.loss_curve == [(10, 2.0), (20, 1.5)]  # the Trainer's own log, as the doctor reads it
    model = load_checkpoint(tmp_path / "checkpoint-20").model
    by_probe = entropy.run(model, tokens).entropy_normalized
    close(result.snapshots[1]["entropy"], by_probe)


def test_the_monitors_snapshots_of_a_model_without_its_code(tmp_path, caplog):
    from gpt_kit import SplitGPT
    from models.tokenizers import CharTokenizer
    from train.monitor import Monitor

    torch.manual_seed(0)
    model = SplitGPT(vocab=40)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    chars = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz .,;:!?'-ABCDE")
    with Monitor(model, optimizer, tmp_path / "run", log_every=1, eval_every=2, save_every=2, report=False,
                 eval_tokens=TOKENS, model_args={"vocab": 40}, tokenizer=chars) as monitor:
        for step in range(5):
            x = torch.randint(0, 40, (4, 17), generator=torch.Generator().manual_seed(step))
            logits = model(x[:, :-1])
            logits = logits[0] if isinstance(logits, tuple) else logits  # (logits, loss) as nanoGPT's
            loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.log(step, train_loss=loss.item())
    result = development.run(tmp_path / "run")
    assert [s["step"] for s in result.snapshots][-1] == 4
    last = result.snapshots[-1]
    assert last["icl_score"] is not None and last["lens_kl"] and last["missing"] == []
    snap = load_checkpoint(tmp_path / "run" / "step_000004")
    tokens = saved_sample(snap)[0]
    live = heads.run(model.eval(), tokens, copying=False).scores["previous_token"]  # the model itself, at step 4
    close(last["scores"]["previous_token"], live, 1e-4)
    repeat = torch.as_tensor(snap.model.readings()["repeat.tokens"])  # [rows 2L]
    length = repeat.shape[1] // 2
    with torch.no_grad():
        logits = model(repeat)
        logits = logits[0] if isinstance(logits, tuple) else logits
        losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), repeat[:, 1:], reduction="none")
    assert last["repeat_loss"] == pytest.approx(float(losses[:, length:].mean()), rel=1e-5)
    assert result.loss_curve and result.loss_curve[0][0] == 0
    # other text cannot be read without the code: said in one line, not silently ignored
    (tmp_path / "other.txt").write_text("abcde " * 40)
    with caplog.at_level("WARNING", logger="probes.development"):
        development.run(tmp_path / "run", data=tmp_path / "other.txt", samples=32)
    said = [r.getMessage() for r in caplog.records if "saved without its code" in r.getMessage()]
    assert len(said) == 1 and "--data" in said[0] and "other.txt" in said[0]
