"""One run, one verdict: a run trained with the Monitor mirroring into an offline W&B run and a
TensorBoard SummaryWriter is diagnosed alike from its run folder, its W&B folder and its event
files (probes.doctor.read_mirror reads the `scratchscope/*` keys back, by their exact names)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from nanogpt_ref import GPT, GPTConfig
from wandb_kit import offline_wandb

from probes.doctor.diagnosis import run as diagnose
from probes.doctor.read_mirror import mirrored_fields
from train.monitor import Monitor

CONFIG = GPTConfig(block_size=8, vocab_size=17, n_layer=2, n_head=2, n_embd=16)
LR, STEPS = 0.5, 30  # AdamW at 0.5 on this toy: layer 0's heads collapse by step 10 (FAILED from the folder)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """The run folder, its W&B run folder and its TensorBoard folder, the user logging loss and lr
    every 5 iters with nanoGPT's keys as the Monitor does."""
    root = tmp_path_factory.mktemp("mirror")
    from torch.utils.tensorboard import SummaryWriter
    with offline_wandb(root) as wandb:
        torch.manual_seed(0)
        model = GPT(CONFIG)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        tokens = torch.randint(0, 17, (4, 9), generator=torch.Generator().manual_seed(0))  # [batch pos]
        run = wandb.init(project="scratchscope-tests", settings=wandb.Settings(console="off"))
        writer = SummaryWriter(root / "tb")
        monitor = Monitor(model, optimizer, root / "run", log_every=5, eval_every=10, eval_tokens=tokens[:, :-1],
                          writer=writer, report=False)
        for it in range(STEPS):
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if it % 5 == 0:
                wandb.log({"iter": it, "train/loss": loss.item(), "lr": LR})
                writer.add_scalar("train/loss", loss.item(), it)
                writer.add_scalar("lr", LR, it)
            monitor.log(it, train_loss=loss.item())
        monitor.close()
        writer.close()
        folder = Path(run.dir).parent
        run.finish()
    return {"folder": root / "run", "wandb": folder, "tensorboard": root / "tb"}


def judged(diagnosis) -> tuple:
    """What a user acts on: the verdict, each finding's code, severity, step and place, and what
    could not be checked."""
    return (diagnosis.verdict, [(f.code, f.severity, f.step, f.where) for f in diagnosis.findings],
            sorted(diagnosis.not_checked), diagnosis.trainer)


def test_the_folder_wandb_and_tensorboard_give_one_verdict(sources):
    folder = diagnose(sources["folder"])
    assert folder.verdict == "failed" and any(f.code == "attention_collapse" for f in folder.findings)
    for name in ("wandb", "tensorboard"):
        other = diagnose(sources[name])
        assert other.source != folder.source  # read from the mirror, not the folder
        assert judged(other) == judged(folder), name
        # float64 through W&B's JSON, float32 through TensorBoard: evidence equal to float32's precision
        for mine, theirs in zip(folder.findings, other.findings):
            for key, value in mine.evidence.items():
                if isinstance(value, float) and math.isfinite(value):
                    assert theirs.evidence[key] == pytest.approx(value, rel=1e-6, abs=1e-30), (name, key)
        assert "Monitor" not in other.format()  # it has the Monitor: no advice to add it


def test_head_keys_win_over_their_layers_mean_and_groups_read_back():
    row = {"iter": 5, "scratchscope/attn_entropy/layer_0": 0.5, "scratchscope/attn_entropy/layer_0/head_1": 0.2,
           "scratchscope/attn_entropy/layer_0/head_0": 0.8, "scratchscope/attn_entropy/layer_1": 0.7,
           "scratchscope/resid_rms/layer_2": 3.0, "scratchscope/update_log10_u/attention_q_k": -2.5,
           "scratchscope/dead_units/blocks.0.mlp.hook_post": 0.25, "scratchscope/diverged": 1.0,
           "scratchscope/logit_max": 4.0, "train/loss": 2.0}
    got = mirrored_fields(row)
    assert got["attn_entropy"] == {"0": [0.8, 0.2], "1": [0.7]}
    assert got["resid_rms"] == {"2": 3.0} and got["logit_max"] == 4.0
    assert got["u_groups"] == {"attention Q/K": -2.5}
    assert got["activations"] == {"blocks.0.mlp.hook_post": {"dead": 0.25}} and "reason" in got["diverged"]
    assert "train_loss" not in got  # the user's own keys are read by the reader's own map
