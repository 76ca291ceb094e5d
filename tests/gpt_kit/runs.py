"""Short Monitor runs of a kit GPT, as a newcomer's loop would write them.

- `train_with_monitor`: a few AdamW steps on rows of a whole context (64) of a text, `model_args`
  recorded, a snapshot at step 0 and at the last step (LlamaGPT and EinsumGPT read back with --model-code).
- `train_run`: `steps` AdamW steps on TEXT (160 characters over 4 letters) in windows of 16, log
  and eval every step (tests/test_hand_gpt_runs.py); `run_json` reads its run.json back.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .einsum import CONTEXT

HAND_CONTEXT = 16  # HandLlama's and HandEinsumGPT's context: train_run's windows
TEXT = "abcabdacbadcbaabcdab" * 8  # 160 characters over 4 letters


def train_with_monitor(model: nn.Module, out, tokenizer, text: str, steps: int = 3, **monitor) -> nn.Module:
    """A few AdamW steps on rows of a whole context of `text` with the Monitor's three lines (a
    snapshot at step 0 and, when it closes, at the last step), as a newcomer's loop would; the model
    back in eval mode."""
    from train.monitor import Monitor

    ids = torch.tensor(tokenizer.encode(text))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    settings = {"log_every": 1, "save_every": 100, "report": False, "model_args": {"vocab": tokenizer.vocab_size},
                "eval_tokens": ids[: 2 * CONTEXT].view(2, CONTEXT), **monitor}
    with Monitor(model, optimizer, out, tokenizer=tokenizer, **settings) as m:
        for step in range(steps):
            start = torch.tensor([0, 7, 13, 21]) + step
            x = torch.stack([ids[s:s + CONTEXT + 1] for s in start])  # [batch pos+1]
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            m.log(step, train_loss=loss.item())
    return model.eval()


def text_ids(tokenizer, text: str = TEXT) -> torch.Tensor:
    return torch.tensor(tokenizer.encode(text))


def train_run(model: nn.Module, out: Path, steps: int = 6, lr: float = 3e-3, **monitor: object) -> Path:
    """`steps` AdamW steps on TEXT under the Monitor (log and eval every step), `monitor` its
    other settings (save_every, tokens_per_step, ...): the run directory."""
    from models.tokenizers import CharTokenizer
    from train.monitor import Monitor

    torch.manual_seed(0)
    tok = CharTokenizer.from_text(TEXT)
    ids = text_ids(tok)
    windows = ids[: 8 * HAND_CONTEXT].view(8, HAND_CONTEXT)  # [batch pos]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    with Monitor(model, opt, out, log_every=1, eval_every=1, eval_tokens=windows[:2], steps=steps,
                 tokenizer=tok, report=False, **monitor) as mon:
        for step in range(steps):
            logits = model(windows[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.log(step, train_loss=loss.item())
    return out


def run_json(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())
