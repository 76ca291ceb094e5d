"""One run, one verdict (issue 56): the doctor's verdict on each run from every source that holds it,
at two eval cadences, and the lead time of its first live warning before a blow-up.

    python benchmarks/bench_verdicts.py                      # 3 models x 2 rates x 2 seeds x 2 cadences
    python benchmarks/bench_verdicts.py --models ours --seeds 1 --steps 200

Each run trains on Tiny Shakespeare's characters with the Monitor (log_every 10, eval_every 10 or
100), mirroring into an offline W&B run and a TensorBoard SummaryWriter at once: our transformer
(a preset's small twin), nanoGPT's GPT and a tutorial GPT written with einsum (user-style models,
read through the tap). "healthy" is AdamW at 3e-3; "blow-up" is AdamW warmed up linearly to 0.3
over the run's first half (it learns, then the rising rate throws it off). Printed per run: the
verdict from the run folder, the W&B run and the TensorBoard log (and whether their findings agree:
code, severity, step, place), the step the loss blew up (non-finite, or a nat above its best), the
first step at which the live doctor (the run cut at each logged step) warns, and the lead between
them (without a loss blow-up: the step of the verdict's failure, an attention collapse). At the end:
false alarms on healthy runs, disagreements between sources, and, per model and
seed, whether the two cadences gave the same verdict.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

CTX, BATCH, LOG_EVERY = 16, 8, 10
RATES = {"healthy": (3e-3, 0), "blow-up": (0.3, 0.5)}  # (peak lr, warmup as a share of the run)
MODELS = ("ours", "nanogpt", "einsum")


def build(kind: str, vocab: int, seed: int):
    import torch
    torch.manual_seed(seed)
    if kind == "ours":
        from dataclasses import replace

        from models import build_model, get_preset
        config = replace(get_preset("transformer2_small"), d_vocab=vocab, n_ctx=CTX)
        return build_model(config)
    if kind == "nanogpt":
        from nanogpt_ref import GPT, GPTConfig
        return GPT(GPTConfig(block_size=CTX, vocab_size=vocab, n_layer=2, n_head=2, n_embd=32))
    from gpt_kit import EinsumGPT
    return EinsumGPT(vocab=vocab, d=32, n_heads=2, n_layers=2, context=CTX)


def logits_of(model, x):
    out = model(x)
    return out[0] if isinstance(out, tuple) else out


def train(kind: str, regime: str, seed: int, eval_every: int, steps: int, root: Path, wandb) -> dict[str, Path]:
    """One run, its Monitor mirroring into W&B and TensorBoard; the three places it can be read from."""
    import torch
    import torch.nn.functional as F
    from torch.utils.tensorboard import SummaryWriter

    from train.monitor import Monitor
    text = (REPO / "data" / "tinyshakespeare.txt").read_text()[:50_000]
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])  # [chars]
    model = build(kind, len(chars), seed)
    peak, warmup = RATES[regime]
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak)
    batches = torch.Generator().manual_seed(seed)
    windows = lambda n, g: torch.stack([ids[s:s + CTX + 1] for s in torch.randint(len(ids) - CTX - 1, (n,), generator=g)])  # noqa: E731
    eval_tokens = windows(4, torch.Generator().manual_seed(1234))[:, :-1]  # [4 CTX]
    run = wandb.init(project="bench-verdicts", settings=wandb.Settings(console="off"))
    writer = SummaryWriter(root / "tb")
    with Monitor(model, optimizer, root / "run", log_every=LOG_EVERY, eval_every=eval_every,
                 eval_tokens=eval_tokens, writer=writer, report=False, steps=steps) as monitor:
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = peak * min(1.0, (step + 1) / max(1, warmup * steps))
            batch = windows(BATCH, batches)  # [BATCH CTX+1]
            loss = F.cross_entropy(logits_of(model, batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % LOG_EVERY == 0:  # the user's own logging, nanoGPT's keys
                lr = optimizer.param_groups[0]["lr"]
                wandb.log({"iter": step, "train/loss": loss.item(), "lr": lr})
                writer.add_scalar("train/loss", loss.item(), step)
                writer.add_scalar("lr", lr, step)
            monitor.log(step, train_loss=loss.item())
            if not math.isfinite(loss.item()) and step % LOG_EVERY == 0:
                break
    writer.close()
    folder = Path(run.dir).parent
    run.finish()
    return {"folder": root / "run", "wandb": folder, "tensorboard": root / "tb"}


def blow_up_step(run: Path) -> int | None:
    from models.checkpoint import read_metrics
    best = math.inf
    for r in read_metrics(run):
        loss = r.get("train_loss")
        if loss is None and "train_loss" in r or loss is not None and (not math.isfinite(loss) or loss > best + 1.0):
            return r["step"]
        if loss is not None:
            best = min(best, loss)
    return None


def first_live_warning(run: Path) -> int | None:
    """The first logged step at which the run, cut there, has a finding above info."""
    from models.checkpoint import read_metrics
    from probes import diagnose
    for step in sorted({r["step"] for r in read_metrics(run)}):
        if diagnose.run(run, step=step).above_info():
            return step
    return None


def judged(d) -> tuple:
    return d.verdict, [(f.code, f.severity, f.step, f.where) for f in d.findings]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per model and rate (default 2)")
    parser.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    parser.add_argument("--cadences", default="10,100", help="eval_every values (default 10,100)")
    parser.add_argument("--keep", type=Path, default=None, help="write the runs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    from wandb_kit import offline_wandb  # the tests' offline W&B set-up: no network, no account

    from probes import diagnose
    cadences = [int(c) for c in args.cadences.split(",")]
    rows, start = [], time.perf_counter()
    print(f"{'model':8} {'rate':8} {'seed':>4} {'every':>5}  {'folder':8} {'W&B':8} {'TB':8} {'agree':5} "
          f"{'broke':>7} {'warned':>6} {'lead':>5}")
    with tempfile.TemporaryDirectory() as scratch, offline_wandb(Path(args.keep or scratch)) as wandb:
        tmp = args.keep or scratch
        for kind in args.models.split(","):
            for regime in RATES:
                for seed in range(1, args.seeds + 1):
                    for every in cadences:
                        root = Path(tmp) / f"{kind}-{regime}-{seed}-{every}"
                        places = train(kind, regime, seed, every, args.steps, root, wandb)
                        got = {name: judged(diagnose.run(path)) for name, path in places.items()}
                        agree = got["wandb"] == got["folder"] == got["tensorboard"]
                        folder = diagnose.run(places["folder"])
                        broke = blow_up_step(places["folder"])
                        if broke is None:  # no loss blow-up: where the verdict's failure starts (a collapse)
                            broke = min((f.step for f in folder.findings if f.severity == "failed"), default=None)
                        warned = first_live_warning(places["folder"])
                        lead = broke - warned if broke is not None and warned is not None and warned < broke else None
                        rows.append((kind, regime, seed, every, got["folder"][0], agree, broke, warned, lead))
                        print(f"{kind:8} {regime:8} {seed:>4} {every:>5}  {got['folder'][0]:8} {got['wandb'][0]:8} "
                              f"{got['tensorboard'][0]:8} {'yes' if agree else 'NO':5} {broke if broke is not None else '-':>7} "
                              f"{warned if warned is not None else '-':>6} {lead if lead is not None else '-':>5}", flush=True)
    healthy = [r for r in rows if r[1] == "healthy"]
    false_alarms = sum(r[4] != "healthy" or r[7] is not None for r in healthy)
    by_run: dict[tuple, set] = {}
    for r in rows:
        by_run.setdefault(r[:3], set()).add(r[4])
    print(f"\n{len(rows)} runs in {time.perf_counter() - start:.0f} s; false alarms on healthy runs (verdict or "
          f"live warning): {false_alarms} of {len(healthy)}; sources disagreeing: {sum(not r[5] for r in rows)}; "
          f"runs whose cadences gave different verdicts: {sum(len(v) > 1 for v in by_run.values())} of {len(by_run)}")
    leads = [r[8] for r in rows if r[1] == "blow-up" and r[6] is not None]
    if leads:
        print(f"blow-ups: {len(leads)}, warned before: {sum(l is not None for l in leads)}, leads (steps): "
              f"{', '.join('-' if l is None else str(l) for l in leads)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
