"""The Monitor on models the store cannot rebuild as ours: each param group's learning rate
logged (an optimizer with no defaults, as nanochat's MuonAdamW), a zero-initialised weight not
called frozen, save_every without eval_tokens refused when the Monitor is made (snapshots of
such models: tests/test_any_snapshot.py)."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from torch import nn

from probes.doctor.diagnosis import run as diagnose
from train.monitor import Monitor



class PlainSGD(torch.optim.Optimizer):
    """SGD whose every group names its own lr, and no defaults (as nanochat's MuonAdamW)."""

    def __init__(self, groups):
        super().__init__(groups, {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


class ZeroOut(nn.Module):
    """Embedding -> MLP whose output projection starts at zero (nanochat's c_proj) -> unembedding."""

    def __init__(self, vocab: int = 7, d: int = 6):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)
        self.out_head = nn.Linear(d, vocab)

    def forward(self, ids):  # [batch pos] -> [batch pos vocab]
        x = self.tok_emb(ids)
        return self.out_head(x + self.mlp(x))


def train(model, optimizer, out, steps, **options):
    torch.manual_seed(1)
    ids = torch.randint(0, 7, (4, 5))
    with Monitor(model, optimizer, out, report=False, **options) as monitor:
        for step in range(steps):
            logits = model(ids)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.log(step, train_loss=loss.item())
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def two_rate_optimizer(model):
    return PlainSGD([{"params": list(model.tok_emb.parameters()) + list(model.out_head.parameters()), "lr": 0.05,
                      "kind": "embed"}, {"params": list(model.mlp.parameters()), "lr": 0.2, "kind": "matrix"}])


def test_each_group_lr_is_logged_and_run_json_names_each_groups_hyperparameters(tmp_path):
    torch.manual_seed(0)
    model = ZeroOut()
    optimizer = two_rate_optimizer(model)
    records = train(model, optimizer, tmp_path / "run", 3, log_every=1, eval_every=0)
    assert [r["lr"] for r in records] == [0.05] * 3  # group 0's, as before
    assert [r["lr_groups"] for r in records] == [[0.05, 0.2]] * 3
    run = json.loads((tmp_path / "run" / "run.json").read_text())["train"]
    assert run["lr"] == 0.05 and run["kind"] == "embed"  # no defaults: group 0's settings
    assert [(g["lr"], g["kind"], g["groups"]) for g in run["param_groups"]] == [
        (0.05, "embed", ["embeddings", "unembedding"]), (0.2, "matrix", ["MLP"])]
    assert [g["parameters"] for g in run["param_groups"]] == [7 * 6 + 6 * 7 + 7, 6 * 12 + 12 + 12 * 6 + 6]
    # u_nominal = lr * g / w with each parameter's own group's lr
    row = records[1]["gwu"]["mlp.0.weight"]
    assert row["u_nominal"] == pytest.approx(0.2 * row["g"] / row["w"], rel=1e-9)
    row = records[1]["gwu"]["tok_emb.weight"]
    assert row["u_nominal"] == pytest.approx(0.05 * row["g"] / row["w"], rel=1e-9)


def test_one_lr_for_every_group_logs_no_lr_groups(tmp_path):
    model = ZeroOut()
    optimizer = torch.optim.SGD([{"params": model.mlp.parameters()}, {"params": model.out_head.parameters()},
                                 {"params": model.tok_emb.parameters()}], lr=0.1)
    records = train(model, optimizer, tmp_path / "run", 2, log_every=1, eval_every=0)
    assert all("lr_groups" not in r and r["lr"] == 0.1 for r in records)


def test_a_weight_starting_at_zero_is_not_frozen_at_the_first_update(tmp_path):
    torch.manual_seed(0)
    model = ZeroOut()
    records = train(model, two_rate_optimizer(model), tmp_path / "run", 1, log_every=1, eval_every=0)
    first = records[0]["gwu"]
    # the zero output projection stops the gradient of the layer before it: it does not move
    assert first["mlp.0.weight"]["g"] == 0.0 and first["mlp.0.weight"]["u"] == 0.0
    assert first["mlp.2.weight"]["u"] is None and first["mlp.2.weight"]["w"] > 0  # moved off zero
    from probes.update_parts.report import UpdateReport
    flags = UpdateReport.from_table(first).flags
    assert flags["mlp.2.weight"] == ["from zero"]
    found = diagnose(tmp_path / "run").findings
    assert not [f for f in found if f.code == "update_ratio_low" and f.evidence.get("frozen")]


def test_a_parameter_that_never_moves_is_still_frozen(tmp_path):
    torch.manual_seed(0)
    model = ZeroOut()
    model.out_head.bias.register_hook(lambda g: torch.zeros_like(g))  # gets a gradient of zeros
    train(model, two_rate_optimizer(model), tmp_path / "run", 4, log_every=1, eval_every=0)
    found = [f for f in diagnose(tmp_path / "run").findings if f.code == "update_ratio_low"]
    assert found and found[0].evidence["frozen"] == 1 and "out_head.bias" in found[0].where


def test_save_every_without_eval_tokens_on_a_model_the_store_cannot_rebuild_is_refused_when_made(tmp_path):
    model = ZeroOut()  # its snapshot keeps what the probes read on a sample of the eval tokens
    with pytest.raises(ValueError, match=r"save_every on a ZeroOut needs eval_tokens=") as refused:
        Monitor(model, two_rate_optimizer(model), tmp_path / "run", save_every=5, report=False)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "run" / "run.json").exists()


def nanochat_gpt():
    return pytest.importorskip("nanochat.gpt")  # its users have it; a clone on PYTHONPATH runs it here


def test_nanochat_muon_adamw_groups_and_lrs(tmp_path, monkeypatch):
    gpt = nanochat_gpt()
    optim = sys.modules["nanochat.optim"]
    for name in ("adamw_step_fused", "muon_step_fused"):  # torch.compile'd: a minute on CPU; run them eagerly
        monkeypatch.setattr(optim, name, getattr(optim, name)._torchdynamo_orig_callable)
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(sequence_len=8, vocab_size=64, n_layer=2, n_head=2, n_kv_head=1, n_embd=32))
    model.init_weights()
    optimizer = model.setup_optimizer()
    assert optimizer.defaults == {}
    ids = torch.randint(0, 64, (2, 9))
    with Monitor(model, optimizer, tmp_path / "run", log_every=1, eval_every=0, report=False) as monitor:
        for step in range(2):
            model(ids[:, :-1].contiguous(), ids[:, 1:].contiguous()).backward()
            optimizer.step()
            model.zero_grad(set_to_none=True)
            monitor.log(step)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    groups = json.loads((tmp_path / "run" / "run.json").read_text())["train"]["param_groups"]
    lrs = [g["lr"] for g in optimizer.param_groups]
    assert records[-1]["lr_groups"] == lrs and len(groups) == len(lrs)
    muon = [g for g in groups if g["kind"] == "muon"]
    assert muon and all(g["lr"] == 0.02 and "momentum" in g for g in muon)
    assert {k for g in muon for k in g["groups"]} == {"attention Q/K", "attention V/O", "MLP"}
    assert math.isclose(records[-1]["lr"], lrs[0])
