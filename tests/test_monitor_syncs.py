"""How often the Monitor makes Python wait for the device: at most 2 host syncs per record step and
3 per eval step, for nanoGPT's GPT (read through our hooked twin) and a tutorial GPT (read through
the attention tap), counted on the CPU as what would sync on a GPU (tests/sync_count.py).

Each step of a monitored run is counted against the same step of a bare run (the loop's own
`loss.item()` and the optimizer's reads cancel out). Before the readings travelled in one transfer
a record step made 5 and an eval step 40-44 at these sizes.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from gpt_kit import BatchedGPT, SdpaGPT
from nanogpt_ref import GPT, GPTConfig
from sync_count import HostSyncs, syncs_per_step
from train.host_copy import HostCopy
from train.monitor import Monitor

STEPS, CTX, VOCAB = 9, 16, 65
MODELS = {"nanogpt": lambda: GPT(GPTConfig(block_size=CTX, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32)),
          "tap, explicit softmax": lambda: BatchedGPT(n_layers=2, n_heads=4, d=32, ctx=CTX, vocab=VOCAB),
          "tap, sdpa": lambda: SdpaGPT(n_layers=2, n_heads=4, d=32, ctx=CTX, vocab=VOCAB)}


def run_syncs(model: torch.nn.Module, tmp_path, monitored: bool) -> list[int]:
    """Host syncs in each step of a short run (log every 2 steps, eval every 4), then at close."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = torch.randint(0, VOCAB, (STEPS, 4, CTX), generator=torch.Generator().manual_seed(0))
    monitor = (Monitor(model, optimizer, tmp_path / "run", log_every=2, eval_every=4, report=False,
                       eval_tokens=torch.randint(0, VOCAB, (3, CTX), generator=torch.Generator().manual_seed(1)))
               if monitored else None)

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        out = model(tokens)
        logits = out[0] if isinstance(out, tuple) else out  # [batch pos vocab]
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())

    return syncs_per_step(model, optimizer, batches, loss_of, monitor)


@pytest.mark.parametrize("kind", MODELS)
def test_the_monitor_syncs_at_most_twice_per_record_and_three_times_per_eval(kind, tmp_path):
    torch.manual_seed(0)
    model = MODELS[kind]()
    bare = run_syncs(copy.deepcopy(model), tmp_path / "bare", monitored=False)
    monitored = run_syncs(model, tmp_path / "monitored", monitored=True)
    extra = [m - b for b, m in zip(bare, monitored)]
    evals, records = extra[0:STEPS:4], extra[2:STEPS:4]  # steps 0, 4, 8 and 2, 6
    assert max(evals) <= 3 and max(records) <= 2, extra
    assert min(evals) >= 1 and min(records) >= 1, extra  # each still brings its numbers over
    assert extra[1:STEPS:2] == [0] * (STEPS // 2) and extra[-1] == 0, extra  # steps between, and close
    assert len((tmp_path / "monitored" / "run" / "metrics.jsonl").read_text().splitlines()) == 5


def test_host_copy_reads_every_dtype_exactly_in_one_transfer():
    """float32, half, bfloat16, int64 counts and bools, 0-d and 1-d, nested: the numbers a direct
    read gives, from one copy to the host (reading the copy is free)."""
    tree = {"entropy": {"0": torch.tensor([1.2345678, float("nan")]), "1": torch.tensor([float("inf")])},
            "counts": [torch.tensor(2**40 + 1), torch.tensor(True)], "half": torch.tensor(0.1, dtype=torch.float16),
            "bf16": torch.tensor([3.14159, -2.5], dtype=torch.bfloat16), "f64": torch.tensor(1 / 3, dtype=torch.float64),
            "name": "kept", "none": None}
    expected = {"entropy": {"0": [1.2345678, float("nan")], "1": [float("inf")]},
                "counts": [float(2**40 + 1), 1.0], "half": float(torch.tensor(0.1, dtype=torch.float16)),
                "bf16": torch.tensor([3.14159, -2.5], dtype=torch.bfloat16).tolist(), "f64": 1 / 3,
                "name": "kept", "none": None}
    expected["entropy"]["0"][0] = float(torch.tensor(1.2345678))  # float32's nearest
    with HostSyncs() as syncs:
        values = HostCopy(tree, finish=lambda v: {**v, "finished": True}).get()
    assert syncs.total == 1 and syncs.counts["to(cpu)"] == 1
    assert values.pop("finished") is True
    nan = values["entropy"]["0"].pop(1), expected["entropy"]["0"].pop(1)
    assert values == expected and all(x != x for x in nan)


def test_the_sync_counter_counts_what_would_sync_on_a_gpu():
    """Each line is one sync on CUDA (or none): the counter agrees, case by case."""
    x, w = torch.randn(5), torch.randn(3, 3)
    cases = [(lambda: float(x.sum()), 1), (lambda: int(x.argmax()), 1), (lambda: bool(x.sum() > 0), 1),
             (lambda: x.tolist(), 1), (lambda: x[x > 0], 1), (lambda: torch.nonzero(x), 1),
             (lambda: torch.equal(x, x), 1), (lambda: w.cpu().numpy(), 1),
             (lambda: x.to("cpu", non_blocking=True).tolist(), 1),  # one transfer, then a host read
             (lambda: x.to(w.device), 0), (lambda: x.to(torch.float64).sum() * 2, 0), (lambda: w @ w, 0)]
    counted = []
    for case, _ in cases:
        with HostSyncs() as syncs:
            case()
        counted.append(syncs.total)
    assert counted == [n for _, n in cases]
