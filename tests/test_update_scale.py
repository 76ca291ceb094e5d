"""Issue 42.4: the update-ratio rules judge each parameter against its own optimizer. A Muon step has
a set size by design (rms = lr / sqrt(fan-in): probes.doctor.update_scale), so a healthy Muon run
moves its weights by about its rate per step, 1.3 orders above makemore's band for Adam. Checked
with torch's own Muon on a tiny character model whose every weight is a matrix (as Muon needs), at
its healthy rate and at 30 times it; an AdamW run of the same model is judged as before the
optimizer was known; the kinds the Monitor writes, for torch's optimizers and for a combined
Muon/AdamW whose groups say their kind (as nanochat's MuonAdamW does). The Adam half of a Muon
optimizer (embeddings, unembedding, scalars) is judged by its step against its role's published
rates: by hand, and on nanochat's own GPT and setup_optimizer() at its default rates (healthy)
and at 30 times them (too fast), where nanochat imports."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from probes.doctor.diagnosis import run as diagnose
from probes.doctor.signals import later_half_medians
from probes.doctor.update_scale import MUON_LR, adjusted_table
from probes.update_parts.report import UpdateReport
from train.monitor import Monitor
from train.monitor.optimizer_kinds import optimizer_kinds

muon = pytest.importorskip("torch.optim").__dict__.get("Muon")
CTX, D = 16, 32


class MatrixLM(nn.Module):
    """A two-layer character model of matrices only: an embedding, a hidden layer, an output layer."""

    def __init__(self, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D, bias=False), nn.ReLU(), nn.Linear(4 * D, D, bias=False))
        self.head = nn.Linear(D, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # [batch pos d]
        return self.head(x + self.mlp(x))  # [batch pos vocab]


def train(out, shakespeare, make_optimizer, steps=40):
    text = shakespeare.read_text()[:20_000]
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    torch.manual_seed(0)
    model = MatrixLM(len(chars))
    optimizer = make_optimizer(model.parameters())
    generator = torch.Generator().manual_seed(0)
    with Monitor(model, optimizer, out, log_every=2, eval_every=0, steps=steps, report=False) as monitor:
        for step in range(1, steps + 1):
            starts = torch.randint(0, len(data) - CTX - 1, (16,), generator=generator)
            xy = torch.stack([data[s:s + CTX + 1] for s in starts])
            loss = nn.functional.cross_entropy(model(xy[:, :-1]).flatten(0, 1), xy[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.log(step, train_loss=loss.item())
    return out


def ratio_findings(run) -> dict[str, str]:
    return {f.code: f.severity for f in diagnose(run).findings if f.code.startswith("update_ratio")}


@pytest.mark.skipif(muon is None, reason="this torch has no torch.optim.Muon")
def test_muon_at_its_rate_is_healthy_and_thirty_times_it_is_too_fast(tmp_path, shakespeare):
    healthy = train(tmp_path / "muon", shakespeare, lambda p: muon(p, lr=0.02, weight_decay=0.0))
    info = json.loads((healthy / "run.json").read_text())
    assert info["muon_shapes"]["mlp.0.weight"] == [4 * D, D] and info["train"]["optimizer"] == "muon"
    first = [json.loads(line) for line in (healthy / "metrics.jsonl").read_text().splitlines()][1]
    row = first["gwu"]["mlp.0.weight"]  # Muon's step: rms lr / sqrt(fan-in), whatever the gradient
    assert 0.5 < row["u"] * row["w"] * math.sqrt(D) / 0.02 < 1.5
    assert math.log10(row["u"]) > -2  # above makemore's band: the reason the rules must know Muon
    assert ratio_findings(healthy) == {}
    fast = train(tmp_path / "muon30", shakespeare, lambda p: muon(p, lr=0.6, weight_decay=0.0))
    assert ratio_findings(fast).get("update_ratio_high") == "warning"
    said = next(f for f in diagnose(fast).findings if f.code == "update_ratio_high")
    assert said.evidence["optimizers"].startswith("muon ")


def test_an_adamw_run_is_judged_as_before_the_optimizer_was_known(tmp_path, shakespeare):
    for lr in (3e-3, 0.3):
        run = train(tmp_path / f"adamw{lr}", shakespeare, lambda p, lr=lr: torch.optim.AdamW(p, lr=lr), steps=30)
        info = json.loads((run / "run.json").read_text())
        assert "optimizer_kinds" not in info and info["train"]["optimizer"] == "adamw"  # one kind: the name says it
        before = diagnose(run)
        names = json.loads((run / "metrics.jsonl").read_text().splitlines()[1])["gwu"]
        for kinds in ({name: "adamw" for name in names}, {}):  # said per parameter, or not at all (an older run)
            info["optimizer_kinds"] = kinds
            (run / "run.json").write_text(json.dumps(info))
            assert diagnose(run).to_dict() == before.to_dict()
    high = next(f for f in before.findings if f.code == "update_ratio_high")  # lr 0.3: on makemore's band
    assert "optimizers" not in high.evidence and max(v for k, v in high.evidence.items() if k.startswith("log10_u")) > -2


class MuonAndAdamW(torch.optim.Optimizer):
    """A combined optimizer whose groups say their kind, as nanochat's MuonAdamW's do (no step here)."""

    def __init__(self, groups):
        super().__init__(groups, defaults={})


def test_the_monitor_writes_each_parameters_optimizer_and_muons_shapes():
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 6), nn.LayerNorm(6))
    combined = MuonAndAdamW([dict(kind="adamw", params=[model[0].weight, model[1].bias, *model[2].parameters()], lr=0.1),
                             dict(kind="muon", params=[model[1].weight], lr=0.02)])
    written = optimizer_kinds(model, combined)
    assert written["optimizer_kinds"] == {"0.weight": "adamw", "1.weight": "muon", "1.bias": "adamw",
                                          "2.weight": "adamw", "2.bias": "adamw"}
    assert written["muon_shapes"] == {"1.weight": [6, 8]}
    assert optimizer_kinds(model, torch.optim.SGD(model.parameters(), lr=0.1)) == {}  # one kind: train.optimizer says it


def test_a_muon_parameters_u_is_moved_by_muons_own_size():
    """u = 0.02 on a [64, 256] weight of rms 1/16 (its fan-in's 1/sqrt(256)): the rate Muon ran at, 0.02."""
    info = {"optimizer_kinds": {"w": "muon", "b": "adamw", "f": "adafactor"}, "muon_shapes": {"w": [64, 256]}}
    table = {"w": {"g": 1.0, "w": 1 / 16, "u": 0.02}, "b": {"g": 1.0, "w": 0.5, "u": 1e-3},
             "f": {"g": 1.0, "w": 0.5, "u": 1e-2}}
    moved = adjusted_table(info, table)
    # 0.02 = lr * 16 / (16 * ...) -> the rate 0.02 over MUON_LR, laid on makemore's -3
    assert math.log10(moved["w"]["u"]) == pytest.approx(-3 + math.log10(0.02 / MUON_LR))
    assert moved["b"] == table["b"] and math.log10(moved["f"]["u"]) == pytest.approx(-2.5)
    assert adjusted_table({}, table) is table  # an older run: as before


def test_the_adam_half_of_a_muon_optimizer_is_judged_by_its_step_against_its_roles_rates():
    """Each role's published Adam rates, taken on noise (|m| / sqrt(v) = 1/3 at b1 0.8), land on the
    band by hand: the middle of a role's rates reads -3 and its two ends half the range either side.
    Embeddings 0.2 .. 0.6: log10(0.6 / sqrt(0.12)) = log10(sqrt(3)) = +0.24 above -3. Unembedding
    0.004 .. 0.22: +-log10(sqrt(55)) = 0.87. Scalars 0.005 .. 0.5: +-1, the band's very edges."""
    w = {"transformer.wte.weight": 2.0, "lm_head.weight": 0.1, "x0_lambdas": 0.5}
    rates = {"transformer.wte.weight": (0.2, 0.6, 0.5 * math.log10(3)),
             "lm_head.weight": (0.004, 0.22, 0.5 * math.log10(55)), "x0_lambdas": (0.005, 0.5, 1.0)}
    kinds = {**{name: "adamw" for name in w}, "transformer.h.0.mlp.c_fc.weight": "muon",
             "transformer.h.0.attn.c_q.weight": "adam"}  # an Adam matrix beside a Muon: makemore's band
    matrix = {"transformer.h.0.attn.c_q.weight": {"g": 1.0, "w": 0.1, "u": 0.05}}
    for end, sign in ((0, -1), (1, 1)):
        table = {name: {"g": 1.0, "w": w[name], "u": rates[name][end] / 3 / w[name]} for name in w} | matrix
        moved = adjusted_table({"optimizer_kinds": kinds}, table)
        for name in w:
            assert math.log10(moved[name]["u"]) == pytest.approx(-3 + sign * rates[name][2])
        assert moved["transformer.h.0.attn.c_q.weight"] == matrix["transformer.h.0.attn.c_q.weight"]
        # thirty times the step: 1.48 orders up, whatever the weight grew to
        faster = {name: {**row, "w": 10 * row["w"], "u": 3 * row["u"]} for name, row in table.items()}
        up = adjusted_table({"optimizer_kinds": kinds}, faster)
        assert all(math.log10(up[n]["u"] / moved[n]["u"]) == pytest.approx(math.log10(30)) for n in w)
        plain = {name: kind for name, kind in kinds.items() if kind != "muon"}  # no Muon: one AdamW rate for all
        assert adjusted_table({"optimizer_kinds": plain}, table) == table


def nanochat_run(out, shakespeare, monkeypatch, times: float = 1.0, steps: int = 40):
    """nanochat's own GPT (2 layers, 64 wide) and its own setup_optimizer() (MuonAdamW), every
    group's rate times `times`, on Tiny Shakespeare's characters."""
    gpt = pytest.importorskip("nanochat.gpt")  # a clone on PYTHONPATH runs it here
    optim = pytest.importorskip("nanochat.optim")
    for name in ("adamw_step_fused", "muon_step_fused"):  # torch.compile'd: a minute on CPU; run them eagerly
        fused = getattr(optim, name)
        monkeypatch.setattr(optim, name, getattr(fused, "_torchdynamo_orig_callable", fused))
    text = shakespeare.read_text()[:20_000]
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(sequence_len=CTX, vocab_size=len(chars), n_layer=2, n_head=4, n_kv_head=2,
                                  n_embd=64, window_pattern="SL"))
    model.init_weights()
    optimizer = model.setup_optimizer()
    for group in optimizer.param_groups:
        group["lr"] *= times
    generator = torch.Generator().manual_seed(0)
    with Monitor(model, optimizer, out, log_every=2, eval_every=0, steps=steps, report=False) as monitor:
        for step in range(1, steps + 1):
            starts = torch.randint(0, len(data) - CTX - 1, (16,), generator=generator)
            xy = torch.stack([data[s:s + CTX + 1] for s in starts])
            loss = model(xy[:, :-1].contiguous(), xy[:, 1:].contiguous())
            loss.backward()
            optimizer.step()
            model.zero_grad(set_to_none=True)
            monitor.log(step, train_loss=loss.item())
    return out


def judged_medians(run) -> dict[str, float]:
    """Each group's later-half median log10 u as the rules judge it."""
    info = json.loads((run / "run.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return later_half_medians([UpdateReport.from_table(adjusted_table(info, r["gwu"]), step=r["step"])
                               for r in records if r.get("gwu")])


def raw_log10_u(run, name: str) -> float:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    us = [r["gwu"][name]["u"] for r in records if r.get("gwu")]
    return math.log10(sorted(us[len(us) // 2:])[len(us[len(us) // 2:]) // 2])


def test_nanochat_at_its_default_rates_is_healthy_and_thirty_times_them_is_too_fast(tmp_path, shakespeare, monkeypatch):
    healthy = nanochat_run(tmp_path / "default", shakespeare, monkeypatch)
    assert ratio_findings(healthy) == {}
    fast = nanochat_run(tmp_path / "thirty", shakespeare, monkeypatch, times=30)
    assert ratio_findings(fast).get("update_ratio_high") == "warning"
    # the embedding's u is blind to the rate (the table grows with it); its step is not
    wte = "transformer.wte.weight"
    assert abs(raw_log10_u(fast, wte) - raw_log10_u(healthy, wte)) < 0.3
    assert judged_medians(fast)["embeddings"] - judged_medians(healthy)["embeddings"] > 0.5
