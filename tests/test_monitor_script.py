"""The Monitor from a training script that is itself called train.py (nanoGPT's is): there Python
finds the script for `import train`, so `from train.monitor import Monitor` cannot work, and
`from scratchscope import Monitor` must. The script never closes the Monitor (nanoGPT's loop just
breaks): its records and the diagnosis must still be written when the interpreter exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from probes import diagnose

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
import torch
print("script body ran", flush=True)   # once: binding our package must not import the script again
from scratchscope import Monitor
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
monitor = Monitor(model, optimizer, sys.argv[1], log_every=2, eval_every=0)
for step in range(5):
    loss = model(torch.randn(16, 4)).pow(2).mean()
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    monitor.log(step, train_loss=loss.item())
import train
print("train is", "ours" if hasattr(train, "__path__") else "the script", flush=True)
"""


def run_script(folder: Path, out: Path) -> subprocess.CompletedProcess:
    (folder / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # as an editable install puts it
    return subprocess.run([sys.executable, "train.py", str(out)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_script_called_train_py_gets_the_monitor_and_its_records_at_exit(tmp_path):
    out = tmp_path / "run"
    proc = run_script(tmp_path, out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("script body ran") == 1
    assert "train is ours" in proc.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2, 4]  # log_every=2, the last pending one written at exit
    assert all(set(r["gwu"]) == {"0.weight", "0.bias", "2.weight", "2.bias"} for r in records)
    for r in records:  # plain SGD: each parameter moved by lr * its gradient, so u == lr * g / w up
        # to float32 rounding of the new weights: an error of ~eps * |w| per entry, ~eps in u
        assert all(abs(row["u"] - row["u_nominal"]) <= 8 * 2**-23 for row in r["gwu"].values())
    assert "doctor:" in proc.stderr  # the diagnosis printed when the interpreter exited
    assert not (out / ".train.lock").exists()
    assert diagnose.run(out).last_step == 4
