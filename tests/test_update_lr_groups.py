"""Each g/w/u row's learning rate when the optimizer's groups differ: our models' per-head rows
(views into a layer's packed q/k/v) take the lr of the parameter they sit in. Plain SGD moves a
weight by exactly lr * g, so every row's u must equal its u_nominal = lr * g / w."""

from __future__ import annotations

import pytest
import torch

from models import build_model, get_preset
from probes.updates import gwu_table, lr_by_name, snapshot_params


def test_per_head_rows_take_their_packed_parameters_group_lr():
    torch.manual_seed(0)
    model = build_model(get_preset("tiny_shakespeare_gpt", dropout=0.0)).double()
    attention = [p for n, p in model.named_parameters() if ".attention." in n]
    rest = [p for n, p in model.named_parameters() if ".attention." not in n]
    optimizer = torch.optim.SGD([{"params": attention, "lr": 0.05}, {"params": rest, "lr": 0.2}])
    ids = torch.randint(0, model.cfg.d_vocab, (2, 16))
    logits = model(ids)  # [batch pos vocab]
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    lrs = lr_by_name(model, optimizer)
    before = snapshot_params(model)
    optimizer.step()
    table = gwu_table(model, before, lrs)
    heads = [n for n in table if ".heads." in n]
    assert heads and all(lrs[n] == 0.05 for n in heads)
    assert set(lrs) == set(table) and all(lr == 0.2 for n, lr in lrs.items() if ".attention." not in n)
    for name, row in table.items():
        if row["u"] is None:  # a weight that was all zeros before the step has no u
            continue
        assert row["u_nominal"] == pytest.approx(row["u"], rel=1e-9), name
