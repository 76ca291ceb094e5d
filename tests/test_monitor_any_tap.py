"""The Monitor's internals on models we never rebuilt (tutorial GPTs, a Hugging Face Llama, a
nanochat-layout GPT), read by the attention tap and forward hooks: each number checked against
the model's own computation or a paper answer, run.json's model from the forward."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from probes import entropy
from train.monitor import Monitor

kit = pytest.importorskip("tests.gpt_kit")


def one_record(model, ids, tmp_path, loss_of=None):
    """One optimizer step of `model` with the Monitor at an eval step: (record, run.json model)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay what they were
    model.train()
    with Monitor(model, optimizer, tmp_path / "run", log_every=1, eval_every=1, eval_tokens=ids,
                 report=False) as monitor:
        from models.tap import logits_of
        logits = logits_of(model(ids))
        nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
        optimizer.step()
        monitor.log(0)
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    return record, json.loads((tmp_path / "run" / "run.json").read_text())["model"]


@pytest.mark.parametrize("build", [kit.PerHeadGPT, kit.BatchedGPT, kit.SdpaGPT, kit.ChatGPT,
                                   lambda: kit.hf_model("llama")], ids=["per_head", "batched", "sdpa", "chat", "llama"])
def test_recorded_entropy_equals_the_entropy_probe_on_the_same_weights(build, tmp_path):
    torch.manual_seed(0)
    model, ids = build(), kit.tokens(2, 16)
    record, described = one_record(model, ids, tmp_path)
    assert model.training  # train mode put back after the eval forward
    probe = entropy.run(model, ids).entropy  # [layer][head]
    logged = [record["attn_entropy"][str(l)] for l in range(len(probe))]
    assert len(record["attn_entropy"]) == len(probe) == described["n_layers"] == 2
    for row, want in zip(logged, probe):
        assert row == pytest.approx(want, abs=2e-6)  # logged to 6 decimals
    assert (described["n_heads"], described["n_ctx"], described["d_vocab"], described["family"]) == (
        4, 16, kit.VOCAB, "transformer")
    from models.store.run import read_metrics_log
    assert read_metrics_log(tmp_path / "run").skipped == []  # the record fits the shape run.json names


def test_attention_logit_max_is_the_largest_visible_score_of_each_head(tmp_path):
    torch.manual_seed(1)
    model, ids = kit.SdpaGPT(), kit.tokens(2, 12)
    record, _ = one_record(model, ids, tmp_path)
    inputs = []  # what each attention module is given [batch pos d]
    handles = [b.sa.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for b in model.blocks]
    with torch.no_grad():
        model.eval()
        model(ids)
    for h in handles:
        h.remove()
    for layer, (block, x) in enumerate(zip(model.blocks, inputs)):
        q, k, _ = block.sa.qkv(x).split(x.shape[-1], dim=-1)  # [batch pos d] each
        q, k = (t.view(2, 12, 4, -1).transpose(1, 2) for t in (q, k))  # [batch head pos d_head]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [batch head q k]
        scores = scores.masked_fill(kit.causal_hidden(12), -math.inf)
        want = scores.amax(dim=(0, 2, 3))  # [head]
        assert record["attn_logit_max"][str(layer)] == pytest.approx(want.tolist(), rel=1e-5)


def test_residual_rms_per_block_and_logit_max_before_the_softcap(tmp_path):
    torch.manual_seed(2)
    model, ids = kit.ChatGPT(softcap=15.0), kit.tokens(2, 16)
    with torch.no_grad():  # raw logits scaled so that the largest is 25, past the cap of 15
        model.eval()
        first = 15.0 * torch.atanh(model(ids).double() / 15.0)  # small logits: tanh is far from flat
        model.lm_head.weight.mul_(25.0 / float(first.abs().max()))
    record, described = one_record(model, ids, tmp_path)
    with torch.no_grad():
        model.eval()
        capped = model(ids).double()  # [batch pos vocab] = 15 tanh(raw / 15)
        raw = 15.0 * torch.atanh(capped / 15.0)
        n = ids.shape[1]
        x = kit.rms(model.transformer["wte"](ids))
        want_rms = []
        for block in model.transformer["h"]:
            x = block(x, model.cos[:, :n], model.sin[:, :n])
            want_rms.append(float(x.square().mean().sqrt()))
    assert capped.abs().max() < 15.0 < record["logit_max"]
    assert record["logit_max"] == pytest.approx(25.0, rel=1e-4)
    assert float(raw.abs().max()) == pytest.approx(25.0, rel=1e-3)  # the model's own, through the cap
    assert [record["resid_rms"][str(i)] for i in range(2)] == pytest.approx(want_rms, rel=1e-5)
    # relu² is a function call: no activation module, said in run.json, not guessed
    assert "activations" not in record and described["activations"].startswith("not measured")
    assert described["attn_windows"] == {"0": 8}  # the short window layer: a quarter of 32 keys


def test_dead_units_where_the_activation_is_a_module(tmp_path):
    torch.manual_seed(3)
    model, ids = kit.BatchedGPT(), kit.tokens(2, 16)
    hidden = model.blocks[0].ffwd[0]  # Linear d -> 4d before nn.ReLU
    with torch.no_grad():
        hidden.bias[: hidden.out_features // 4] = -1e4  # a quarter of layer 0's units never fire
    record, described = one_record(model, ids, tmp_path)
    acts = record["activations"]
    assert acts["blocks.0.ffwd.1"]["dead"] == 0.25
    assert acts["blocks.1.ffwd.1"]["dead"] < 0.25 and described["act_fn"] == "relu"


def test_the_eval_forward_leaves_gradients_and_modes_alone(tmp_path):
    model, ids = kit.PerHeadGPT(), kit.tokens(2, 8)
    model.train()
    model.trf_blocks[0].eval()  # a module the user keeps in eval mode stays so
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, optimizer, tmp_path / "run", log_every=1, eval_every=1, eval_tokens=ids,
                 report=False) as monitor:
        nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        monitor.log(0)  # an eval record before the step
        optimizer.step()
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert model.training and not model.trf_blocks[0].training and model.trf_blocks[1].training


def test_eval_tokens_the_model_cannot_read_are_refused_when_made(tmp_path):
    model = kit.PerHeadGPT()
    with pytest.raises(ValueError, match="PerHeadGPT failed on eval_tokens of shape") as refused:
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), tmp_path / "run",
                eval_tokens=torch.full((1, 4), kit.VOCAB + 5), report=False)
    assert "\n" not in str(refused.value)


class ReluBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    def forward(self, x):  # the residual stream after the block, as a transformer block returns it
        return x + self.mlp(x)


class Stack(nn.Module):
    """Embedding (10 ids, 8 wide), the given residual blocks in turn, a head."""

    def __init__(self, blocks):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(8, 10)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class NoAttention(Stack):
    """Two residual ReLU blocks: nothing the tap can read."""

    def __init__(self):
        super().__init__(ReluBlock() for _ in range(2))


def test_a_model_without_attention_gets_its_other_internals_and_one_line_why(tmp_path, caplog):
    torch.manual_seed(4)
    model, ids = NoAttention(), torch.randint(0, 10, (2, 5))
    with caplog.at_level("INFO", logger="train.monitor"):
        record, described = one_record(model, ids, tmp_path)
    assert "attn_entropy" not in record and set(record["activations"]) == {"blocks.0.mlp.1", "blocks.1.mlp.1"}
    with torch.no_grad():
        x = model.emb(ids)
        x = x + model.blocks[0].mlp(x)
    assert record["resid_rms"]["0"] == pytest.approx(float(x.square().mean().sqrt()), rel=1e-6)
    assert described["family"] == "other" and described["attention"].startswith("not measured: NoAttention")
    assert sum("not measured" in m for m in caplog.messages) == 1


class MaybeAttention(nn.Module):
    def __init__(self, attend: bool):
        super().__init__()
        self.attend, self.proj = attend, nn.Linear(8, 8)

    def forward(self, x):  # [batch pos 8]
        if not self.attend:
            return x + self.proj(x)
        q = k = v = x.view(*x.shape[:2], 2, 4).transpose(1, 2)  # [batch head pos 4]
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(x.shape))


class SomeBlocksAttend(Stack):
    def __init__(self):
        super().__init__(MaybeAttention(a) for a in (True, False, True))


def test_records_fit_the_layers_run_json_names_when_blocks_and_attention_layers_differ(tmp_path):
    from models.store.run import read_metrics_log
    record, described = one_record(SomeBlocksAttend(), torch.randint(0, 10, (2, 5)), tmp_path)
    assert (described["n_layers"], described["n_heads"]) == (2, 2) and sorted(record["attn_entropy"]) == ["0", "1"]
    assert "resid_rms" not in record and described["resid_rms"].startswith("not measured: 3 blocks found")
    assert read_metrics_log(tmp_path / "run").skipped == []  # every record fits the run's shape
