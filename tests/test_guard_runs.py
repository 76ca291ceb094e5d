"""The guard where runs are made: `python -m train --guard` (rescues, then a clean stop with exit
code 3, nothing on disk touched), torchrun DDP with gloo on two CPU processes (every rank decides
alike, replicas equal afterwards; our trainer and a user's loop), a sweep passing --guard, the
Hugging Face callback, and the rescue marker on the app's loss chart."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.checkpoint import read_metrics
from probes.sweep_parts.stats import run_finished, run_outcome
from train.loop import RANK_DUMP_ENV, main
from train.guard import Guard

REPO_ROOT = Path(__file__).resolve().parent.parent
BLOW_UP = ["--preset", "transformer4_small", "--steps", "30", "--batch-size", "4", "--log-every", "2",
           "--eval-every", "10", "--save-every", "0", "--optimizer", "sgd", "--lr", "1e6", "--guard"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40, encoding="utf-8")
    return path


def tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in path.rglob("*") if p.is_file()}


def test_train_guard_rescues_twice_then_stops_with_code_3_leaving_the_snapshot_on_disk(text_file, tmp_path, caplog):
    out = tmp_path / "run"
    caplog.set_level("INFO", logger="train")
    assert main(["--data", str(text_file), "--out", str(out), *BLOW_UP]) == 3
    records = read_metrics(out)
    rescues = [r["rescue"] for r in records if "rescue" in r]
    most, cut = Guard().max_rescues, Guard().cut
    assert [r["action"] for r in rescues] == ["rewind"] * most + ["stop"]
    assert all(r["restored_step"] == 0 and r["kind"] == "rate_blowup" for r in rescues)  # where training started
    # no update ratios in our loop's judgement: cut x the rate, then cut x the cap it blew up under
    assert [r["lr_cap"] for r in rescues[:most]] == pytest.approx([cut ** k * 1e6 for k in range(1, most + 1)])
    assert [r for r in records if r.get("diverged")][0]["step"] == records[-1]["step"]  # only the stop's step
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "run.json", "step_000000"]
    assert json.loads((out / "run.json").read_text())["guard"] == Guard(mode="act").to_json()  # its settings
    outcome = run_outcome(out)  # what a sweep records of it
    assert (outcome["rescues"], outcome["diverged_by"], run_finished(outcome)) == (most, "guard", True)
    stops = [r.message for r in caplog.records if r.message.startswith("guard: stopped the run")]
    assert len(stops) == 1 and "--set qk_norm=rms" in stops[0] and "python -m train.sweep" in stops[0]


def test_a_sweep_passes_guard_to_every_run():
    from train.sweep.cli import build_parser
    args = build_parser().parse_args(["--preset", "transformer4_small", "--data", "x.txt", "--lr", "1e-3,1",
                                      "--out", "s", "--guard"])
    assert args.train_args == ["--guard"]


def torchrun(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_train_guard_under_ddp_rewinds_every_rank_alike(text_file, tmp_path):
    out, dumps = tmp_path / "ddp", tmp_path / "ranks"
    dumps.mkdir()
    proc = torchrun(["-m", "train", "--data", str(text_file), "--out", str(out), "--device", "cpu", *BLOW_UP],
                    {RANK_DUMP_ENV: str(dumps)})
    assert proc.returncode != 0 and "exitcode  : 3" in proc.stderr, proc.stderr[-3000:]  # torchrun says 1
    actions = [r["rescue"]["action"] for r in read_metrics(out) if "rescue" in r]
    assert actions == ["rewind"] * Guard().max_rescues + ["stop"]
    rank0, rank1 = (load_file(str(dumps / f"rank{r}.safetensors")) for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)


USER_LOOP = """
    import json, math, sys
    import torch, torch.distributed as dist, torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from models import PRESETS, build_model
    from train.monitor import Monitor
    from train.guard import Guard

    dist.init_process_group("gloo")
    rank, out = dist.get_rank(), sys.argv[1]
    torch.manual_seed(0)
    cfg = PRESETS["transformer4_rms_small"].config.replace(n_layers=1)
    model = build_model(cfg)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    guard = Guard(every=5)
    monitor = Monitor(model, optimizer, out + "/run", guard=guard, report=False) if rank == 0 else \\
        guard.attach(model, optimizer)
    for step in range(25):
        rows = torch.randint(0, cfg.d_vocab, (4, cfg.n_ctx + 1), generator=torch.Generator().manual_seed(2 * step + rank))
        loss = F.cross_entropy(ddp(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        monitor.log(step, train_loss=math.nan if rank == 1 and step == 17 else loss.item())  # rank 1 alone sees it
    run = monitor.guard if rank == 0 else monitor
    torch.save({"rescues": run.rescues, "weights": model.state_dict()}, f"{out}/rank{rank}.pt")
    monitor.close()
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_user_loop_under_ddp_decides_on_every_rank_and_keeps_the_replicas_equal(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n" + textwrap.dedent(USER_LOOP))
    proc = torchrun([str(script), str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert rank0["rescues"] == rank1["rescues"] and [r["step"] for r in rank0["rescues"]] == [17]
    assert rank0["rescues"][0]["restored_step"] == 15
    assert all(torch.equal(rank0["weights"][k], rank1["weights"][k]) for k in rank0["weights"])
    [record] = [r for r in read_metrics(tmp_path / "run") if "rescue" in r]
    assert record["step"] == 17 and record["rescue"]["trigger"] == "the loss is nan"  # rank 1's, averaged in
    assert math.isfinite(record["train_loss"]) and record["lr"] == 3e-3  # rank 0's loss; the rate of step 17


def test_the_hf_callback_guards_the_trainer_and_stops_it_the_trainers_way(tmp_path):
    transformers = pytest.importorskip("transformers")
    from test_monitor import hf_gpt2, CONFIG
    from train.monitor import HFCallback

    class PoisonAt(transformers.TrainerCallback):
        """The weights turn NaN after the optimizer step of step 6: every later loss and gradient is NaN."""

        def on_optimizer_step(self, args, state, control, model=None, **kwargs):
            if state.global_step + 1 >= 6:
                with torch.no_grad():
                    model.transformer.wte.weight.fill_(math.nan)

    rows = torch.randint(0, CONFIG.vocab_size, (40, CONFIG.block_size), generator=torch.Generator().manual_seed(0))
    examples = [{"input_ids": r, "labels": r} for r in rows]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), use_cpu=True, report_to=[], max_steps=20, logging_steps=2,
        per_device_train_batch_size=4, learning_rate=1e-3, save_strategy="no", disable_tqdm=True, seed=0,
        logging_nan_inf_filter=False)
    callback = HFCallback(tmp_path / "run", log_every=2, guard=True, report=False)
    trainer = transformers.Trainer(model=hf_gpt2(), args=args, train_dataset=examples, callbacks=[callback, PoisonAt()])
    trainer.train()
    rescues = [(r["step"], r["rescue"]["action"]) for r in read_metrics(tmp_path / "run") if "rescue" in r]
    actions = [a for _, a in rescues]  # each step's own loss is judged: the rate floor may stop it before max_rescues
    assert actions[-1] == "stop" and set(actions[:-1]) == {"rewind"} and len(actions) - 1 <= Guard().max_rescues
    assert 6 <= rescues[0][0] <= 8
    assert trainer.state.global_step < 20  # stopped early, the Trainer's way (no exception through it)


def test_the_loss_chart_marks_each_rescue(monkeypatch, tmp_path):
    from app_kit import open_app
    from chart_kit import specs
    from test_guard import tiny, train as plain_loop
    from train.monitor import Monitor

    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with Monitor(model, optimizer, tmp_path / "rescued", guard=Guard(every=10), report=False) as monitor:
        plain_loop(model, optimizer, 50, lambda s, v: monitor.log(s, train_loss=v), blow_up_at=35)
    at = open_app(monkeypatch, [tmp_path], "overview", run="rescued")
    [(spec, datasets)] = specs(at, "loss")
    marks = next(f for f in datasets if "guard" in f.columns)
    assert list(marks["step"]) == [36 + Guard().patience - 1] and list(marks["guard"]) == ["rescued"]
    assert "restored step 30" in marks["rescue"][0]
    assert "guard" in json.dumps(spec)


def test_train_guard_reads_the_attention_and_rewinds_to_its_last_spread_state(text_file, tmp_path, monkeypatch):
    """`python -m train --guard` at a healthy rate, its attention read every 25 steps on val blocks
    (here faked: spread at the readings of steps 5 and 30, one-hot at 55): one rewind at 55, to the
    newest snapshot before step 31, capped at cut x the rate; every other number the run's own. The
    loss is taken as not falling (here it falls 0.44 nats over 31-55 against a noise line of 0.52): a
    collapse while it clearly falls is a phase change, left alone (tests/test_guard_attention.py)."""
    import math

    import train.data
    real, calls = train.data.forward_stats, []

    def faked(model, inputs, doctor=True):
        if doctor:
            return real(model, inputs, doctor)
        calls.append(inputs.shape)
        n = inputs.shape[1]
        level = math.lgamma(n + 1) / n * (0.95 if len(calls) < 3 else 0.02)  # nats: spread, then one-hot
        return {"attn_entropy": {"0": [level] * 4}}

    monkeypatch.setattr(train.data, "forward_stats", faked)
    monkeypatch.setattr("train.guard.run.falling", lambda losses, noise: False)  # the wiring here, not the margin
    out = tmp_path / "run"
    args = ["--preset", "transformer4_small", "--optimizer", "adam", "--lr", "3e-3", "--steps", "60", "--batch-size", "4",
            "--log-every", "5", "--eval-every", "100", "--save-every", "0", "--guard"]
    assert main(["--data", str(text_file), "--out", str(out), *args]) == 0
    [rescue] = [r["rescue"] for r in read_metrics(out) if "rescue" in r]
    assert (rescue["kind"], rescue["action"], rescue["trouble_began"]) == ("rate_blowup", "rewind", 31)
    assert 0 <= rescue["restored_step"] <= 30  # the newest snapshot at or before the last spread reading
    assert "collapsed" in rescue["why"] and rescue["lr_cap"] == pytest.approx(Guard().cut * 3e-3)  # a constant rate: cut x it
    from train.guard.loop import ATTENTION_ROWS
    assert len(calls) == 3 and calls[0][0] == ATTENTION_ROWS  # read at 5, 30, 55 on the first val blocks
