"""The doctor warns ahead of a blow-up on models we never rebuilt, and stays silent on the same
runs at a healthy rate: a tiny Llama in a real `transformers.Trainer` with `HFCallback`, and a
tutorial GPT in a plain loop, each on Tiny Shakespeare's characters, its learning rate warmed up
to far too high a peak. The lead time is the logged steps between the first warning (the run
diagnosed as if it had stopped there, as the live doctor does) and the loss's blow-up (a whole
nat above its best so far, or not finite)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from probes.doctor.diagnosis import run as diagnose

kit = pytest.importorskip("tests.gpt_kit")

CTX = 32
INTERNAL = {"resid_rms_growth", "attn_logit_growth", "output_logit_growth", "attention_collapse"}


def characters(path, n: int = 100_000) -> tuple[torch.Tensor, int]:
    text = path.read_text()[:n]
    chars = sorted(set(text))
    return torch.tensor([chars.index(c) for c in text]), len(chars)


def batch(data: torch.Tensor, generator: torch.Generator, size: int = 8) -> torch.Tensor:
    """[size CTX+1] windows of the text."""
    starts = torch.randint(0, len(data) - CTX - 1, (size,), generator=generator)
    return torch.stack([data[s:s + CTX + 1] for s in starts])


def records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def blow_up(run) -> int | None:
    best = math.inf
    for r in records(run):
        loss = r.get("train_loss")
        if loss is None:
            continue
        if not math.isfinite(loss) or loss > best + 1.0:
            return r["step"]
        best = min(best, loss)
    return None


def first_warnings(run) -> tuple[int | None, int | None]:
    """(first logged step at which the doctor warns, first at which an internals rule warns)."""
    first = internal = None
    for step in sorted({r["step"] for r in records(run)}):
        warned = {f.code for f in diagnose(run, step).findings if f.severity != "info"}
        if warned and first is None:
            first = step
        if warned & INTERNAL:
            internal = step
            break
    return first, internal


def tutorial_run(out, data, vocab, peak, warmup, steps):
    torch.manual_seed(0)
    model = kit.BatchedGPT(n_layers=2, n_heads=4, d=32, ctx=CTX, vocab=vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    from train.monitor import Monitor
    with Monitor(model, optimizer, out, log_every=5, eval_every=5, eval_tokens=data[:4 * CTX].view(4, CTX),
                 report=False) as monitor:
        for step in range(steps):
            for group in optimizer.param_groups:  # linear warmup
                group["lr"] = peak * min(1.0, (step + 1) / warmup)
            xy = batch(data, generator)
            logits, loss = model(xy[:, :-1], xy[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.log(step, train_loss=loss.item())
    return out


def trainer_run(out, data, vocab, peak, warmup, steps):
    transformers = pytest.importorskip("transformers")
    from train.monitor import HFCallback
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=CTX, attn_implementation="sdpa"))

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            x = batch(data, torch.Generator().manual_seed(i), 1)[0, :CTX]
            return {"input_ids": x, "labels": x}

    args = transformers.TrainingArguments(
        output_dir=str(out) + "_trainer", max_steps=steps, learning_rate=peak, warmup_steps=warmup,
        lr_scheduler_type="constant_with_warmup", per_device_train_batch_size=8, logging_steps=5,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, weight_decay=0.0, seed=0)
    callback = HFCallback(out, log_every=5, eval_every=5, eval_tokens=data[:4 * CTX].view(4, CTX), report=False)
    transformers.Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[callback]).train()
    return out


@pytest.mark.parametrize("train, high, healthy", [
    (tutorial_run, dict(peak=1.0, warmup=300, steps=150), dict(peak=1e-3, warmup=1, steps=120)),
    (trainer_run, dict(peak=1.0, warmup=100, steps=200), dict(peak=3e-4, warmup=0, steps=150)),
], ids=["tutorial_loop", "llama_trainer"])
def test_the_doctor_warns_before_the_blow_up_and_not_at_a_healthy_rate(train, high, healthy, tmp_path, shakespeare):
    data, vocab = characters(shakespeare)
    bad = train(tmp_path / "high", data, vocab, **high)
    blown = blow_up(bad)
    first, internal = first_warnings(bad)
    assert blown is not None, "the run at too high a rate must blow up for the lead time to mean anything"
    assert first is not None and first < blown
    assert internal is not None and internal < blown  # the model's insides, not only the optimizer's side
    good = train(tmp_path / "healthy", data, vocab, **healthy)
    assert blow_up(good) is None
    assert first_warnings(good) == (None, None)
    run_model = json.loads((good / "run.json").read_text())["model"]
    assert run_model["family"] == "transformer" and run_model["n_layers"] == 2
