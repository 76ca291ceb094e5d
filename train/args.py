"""The command line of `python -m train`, torch-free so that `--help` and bad arguments are
answered before torch is imported (see `models.cli`); `train.config` resolves the values."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from models.cli import NON_NEGATIVE_INT, Parser, path_type

# Built-in defaults, used when neither a flag, a resumed run nor the preset's recipe gives one.
TRAIN_DEFAULTS: dict[str, Any] = {
    "optimizer": "adamw", "lr": 3e-4, "momentum": 0.0, "nesterov": False, "betas": [0.9, 0.999],
    "weight_decay": 0.0, "batch_size": 32, "grad_accum": 1, "steps": 1000, "warmup": 0, "schedule": None,
    "min_lr_ratio": 0.1, "grad_clip": 0.0, "log_every": 10, "eval_every": 100, "eval_batches": 4,
    "save_every": 500, "val_fraction": 0.1, "seed": 1337, "dtype": "fp32", "z_loss": 0.0,
    "unembed_weight_decay": None}
OPTIMIZERS = ("sgd", "adam", "adamw")
BPE_VOCAB = 2048  # --bpe-vocab's default


def _betas(text: str) -> list[float]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected two numbers like 0.9,0.95, got {text!r}")
    return [float(x) for x in parts]


def train_config_flags(p: argparse.ArgumentParser) -> None:
    """Hyperparameter flags; None means: the resumed run's value, else the preset's, else built-in."""
    d = TRAIN_DEFAULTS
    flag = p.add_argument
    flag("--steps", type=int, help=f"total optimizer steps (default {d['steps']})")
    flag("--batch-size", type=int, help="windows per micro-batch and rank (default: the preset's)")
    flag("--grad-accum", type=int, help="micro-batches per optimizer step: windows per step = "
                                        "batch-size x grad-accum x ranks (default 1)")
    flag("--lr", type=float, help="peak learning rate (default: the preset's)")
    flag("--optimizer", choices=OPTIMIZERS, help="default: the preset's (series: sgd, GPT: adamw)")
    flag("--momentum", type=float, help="SGD momentum (default: the preset's, else 0)")
    flag("--nesterov", action=argparse.BooleanOptionalAction,
         help="SGD Nesterov momentum (default: the preset's, else off)")
    flag("--betas", type=_betas, help="Adam/AdamW betas as B1,B2 (default: the preset's, else 0.9,0.999)")
    flag("--weight-decay", type=float,
         help="decay on parameters with 2+ dims only (the GPT-2 recipe; default: the preset's, else 0)")
    flag("--unembed-weight-decay", type=float,
         help="weight decay on the unembedding matrix W_out alone, against output-logit growth "
              "(default: --weight-decay's; needs a separate unembedding)")
    flag("--z-loss", type=float, metavar="COEF",
         help="add COEF * log^2 Z of the output softmax to the loss, logged on its own as z_loss "
              "(PaLM, Wortsman et al. 2023 use 1e-4; default 0 = off)")
    flag("--warmup", type=int, help="linear warmup steps (default: the preset's, else 0)")
    flag("--schedule", choices=("constant", "cosine"),
         help="after warmup: constant, or cosine down to --min-lr-ratio * lr at the last step "
              "(default: cosine when there is a warmup, else constant as in the series)")
    flag("--min-lr-ratio", type=float, help=f"cosine floor as a fraction of lr (default {d['min_lr_ratio']})")
    flag("--grad-clip", type=float, help="clip the global grad norm to this; 0 = off (default: the preset's)")
    flag("--log-every", type=int, help=f"steps between metrics records (default {d['log_every']})")
    flag("--eval-every", type=int, help=f"steps between val loss / entropy evals (default {d['eval_every']})")
    flag("--eval-batches", type=int, help=f"fixed val batches per eval (default {d['eval_batches']})")
    flag("--save-every", type=int, help=f"steps between snapshots; 0 = end only (default {d['save_every']})")
    flag("--val-fraction", type=float, help="last fraction of the tokens held out for val (default 0.1)")
    flag("--seed", type=int, help=f"seed for init and batch sampling (default {d['seed']})")


def parse_sets(cfg: Any, items: list[str]) -> dict[str, Any]:
    """--set key=value pairs typed by the config's field annotations (torch-free: `train.sweep`
    checks a sweep's --vary values with it before any run starts)."""
    hints = typing.get_type_hints(type(cfg))
    fields = {f.name for f in dataclasses.fields(cfg)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(fields)}")
        kind = hints[key]
        try:
            if kind is bool:
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                out[key] = text.lower() in ("true", "1")
            else:
                out[key] = kind(text) if kind in (int, float) else text
        except ValueError:
            raise ValueError(f"--set {item!r}: {key} must be {kind.__name__}") from None
    return out


EXAMPLES = """examples:
  python -m train --preset transformer4_rms_small --data data/tinyshakespeare.txt --out runs/x
  python -m train --out runs/x --resume --steps 3000
  torchrun --nproc_per_node=2 -m train --preset tiny_shakespeare_gpt --data data/tinyshakespeare.txt --out runs/gpt --dtype bf16
"""


def build_parser() -> Parser:
    p = Parser(prog="python -m train", epilog=EXAMPLES,
               description="Train a preset on a text file and write a run directory (snapshots, "
                           "metrics.jsonl, run.json) that the probes and the app read. "
                           "Hyperparameters default to the preset's recorded recipe; a flag "
                           "overrides it; on --resume the run's own saved values do.")
    p.add_argument("--preset", metavar="NAME", help="model preset (required unless --resume)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model config field, e.g. --set n_layers=2 (repeatable)")
    p.add_argument("--data", type=path_type,
                   help="UTF-8 text file to train on (on --resume: default the file the run recorded)")
    p.add_argument("--tokenizer", choices=("char", "bpe"), default=None,
                   help="char (default): one token per character; bpe: SentencePiece BPE trained "
                        "on --data. A resumed run keeps its own")
    p.add_argument("--bpe-vocab", type=int, default=None,
                   help=f"BPE vocabulary size with --tokenizer bpe (default {BPE_VOCAB}; a resumed run keeps its own)")
    p.add_argument("--out", type=path_type, required=True, metavar="RUN_DIR",
                   help="run directory to create (an existing run is refused unless --resume)")
    p.add_argument("--resume", action="store_true",
                   help="continue RUN_DIR from its latest snapshot, optimizer state included")
    p.add_argument("--new-schedule", action="store_true",
                   help="on --resume, accept a --steps that changes a cosine schedule's horizon "
                        "(and so the learning rate from the resumed step on)")
    train_config_flags(p)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                   help="fp32 (default) or bf16 autocast (CUDA; also allowed on CPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (off by default)")
    p.add_argument("--gwu-table", action="store_true",
                   help="print the full g/w/u table at every eval (default: a one-line group summary)")
    p.add_argument("--keep-going", action="store_true",
                   help="train on after the loss or an entropy turns NaN/inf (default: save a "
                        "snapshot of that moment and stop with exit code 3)")
    p.add_argument("--guard", nargs="?", const="act", choices=("act", "watch"), metavar="watch",
                   help="keep snapshots of the model and optimizer in memory; on a NaN or a loss spike, "
                        "rewind to the last one before the trouble, cap the learning rate and train on "
                        "(two rescues, then a stop with exit code 3 naming the fix); --guard watch only "
                        "logs what it would do (docs/guard.md)")
    p.add_argument("--diagnose-every", type=NON_NEGATIVE_INT, default=0, metavar="N",
                   help="run the run doctor (probes.diagnose) every N steps and print each new "
                        "finding once; 0 = only when training stops")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar over steps (default: on when stderr is a terminal)")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return p


