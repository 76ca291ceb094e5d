"""The command lines of the causal probes, torch-free (see `probes.args`):
`python -m probes.patching` and `python -m probes.ablate`."""

from __future__ import annotations

import argparse

from models.cli import POSITIVE_INT, Parser, add_json_argument, number_type
from probes.args import probe_parser

GPT = "checkpoints/shakespeare_gpt"  # a shipped run, for the examples
WHATS = ("heads", "resid", "attn", "mlp")  # probes.patching.cells.WHATS is this tuple
METHODS = ("exact", "attribution")  # probes.patching.runner.METHODS (likewise)
HOWS = ("zero", "mean")  # probes.ablate.HOWS (likewise)


def _atp_star_needs_attribution(args: argparse.Namespace) -> str | None:
    if args.atp_star and args.method != "attribution":
        return "--atp-star corrects attribution patching: add --method attribution"
    return None


def patching_parser() -> Parser:
    parser = probe_parser(
        "patching", "Activation patching: run the model on a clean and a corrupt text of the same token "
        "length and patch one activation at a time from one run into the other (each head's output z, the "
        "residual stream entering each block, or each attention / MLP output; per position or at all "
        "positions), scoring each patched run by the logit difference answer - wrong at the last position "
        "(or the answer's log-probability without --wrong). Prints the largest effects and a heat map of "
        "(patched - corrupt) / (clean - corrupt); --method attribution estimates every patch from two "
        "forward passes and one backward.",
        f"--ckpt {GPT} --clean 'ROMEO: But soft, what light' --corrupt 'JULIA: But soft, what light' "
        "--answer ' ' --wrong 'e'",
        f"--ckpt {GPT} --clean 'the king' --corrupt 'the kine' --answer ' ' --what resid --json",
        f"--ckpt {GPT} --clean 'the king' --corrupt 'the kine' --answer ' ' --method attribution --atp-star",
        checks=[_atp_star_needs_attribution])
    parser.add_argument("--clean", required=True, metavar="TEXT", help="the clean prompt")
    parser.add_argument("--corrupt", required=True, metavar="TEXT",
                        help="the corrupt prompt (the same number of tokens as --clean)")
    parser.add_argument("--answer", required=True, metavar="TOKEN",
                        help="the token the clean run should predict next (one token: a text or vocabulary piece)")
    parser.add_argument("--wrong", metavar="TOKEN",
                        help="score by the logit difference answer - wrong (default: the answer's log-probability)")
    parser.add_argument("--what", choices=WHATS, default="heads",
                        help="heads: each head's output z; resid: the residual stream entering each block; "
                             "attn / mlp: each block's attention / MLP output")
    parser.add_argument("--by-position", action=argparse.BooleanOptionalAction, default=True,
                        help="one patch per position (--no-by-position: each activation at all positions at once)")
    parser.add_argument("--method", choices=METHODS, default="exact",
                        help="exact: every patched run computed; attribution: estimated from gradients "
                             "(2 forwards + 1 backward)")
    parser.add_argument("--atp-star", action="store_true",
                        help="with --method attribution: recompute the attention softmax exactly where a patch "
                             "moves queries or keys (AtP*, Kramar et al. 2024)")
    parser.add_argument("--noise", action="store_true",
                        help="noising: patch the corrupt activation into the clean run (default: denoising, "
                             "the clean activation into the corrupt run)")
    parser.add_argument("--batch", type=POSITIVE_INT, metavar="N",
                        help="patched runs per forward pass (default: as many as fit in 256 MiB)")
    add_json_argument(parser)
    return parser


def heads_type(text: str) -> list[tuple[int, int]]:
    """--heads 1.0,1.2 -> [(1, 0), (1, 2)]."""
    heads = []
    for item in text.split(","):
        layer, dot, head = item.strip().partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise argparse.ArgumentTypeError(f"a head is LAYER.HEAD (e.g. 1.0), got {item.strip()!r}")
        heads.append((int(layer), int(head)))
    return heads


def _text_or_repeat(args: argparse.Namespace) -> str | None:
    if args.text is not None and args.repeat:
        return "give --text or --repeat, not both"
    if args.length is not None and not args.repeat:
        return "--length applies to --repeat only"
    return None


def ablate_parser() -> Parser:
    parser = probe_parser(
        "ablate", "Head ablation: the mean next-token loss with each listed head's output (its z) set to zero "
        "or to its mean over the tokens, each head alone and all of them together, and the change in loss "
        "per token with all of them ablated.",
        f"--ckpt {GPT} --heads 1.0,1.2 --text 'ROMEO: But soft, what light'",
        f"--ckpt {GPT} --heads 0.3,1.5 --how mean --repeat --json", checks=[_text_or_repeat])
    parser.add_argument("--heads", required=True, type=heads_type, metavar="L.H,...",
                        help="the heads to ablate as LAYER.HEAD, comma-separated (0-based)")
    parser.add_argument("--how", choices=HOWS, default="zero", help="set z to zero, or to its mean over the tokens")
    parser.add_argument("--text", help="the text to measure the loss on (default: a window of the run's own text)")
    parser.add_argument("--repeat", action="store_true",
                        help="random tokens repeated twice (--length of them, --samples sequences, --seed): "
                             "induction heads' loss")
    parser.add_argument("--length", type=number_type(int, low=2, noun="length"), metavar="N",
                        help="random tokens before the repeat (default: half the context)")
    parser.add_argument("--samples", type=POSITIVE_INT, default=8, metavar="N",
                        help="sequences (or windows of the run's text) to average over")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed for --repeat and the run's windows")
    add_json_argument(parser)
    return parser
