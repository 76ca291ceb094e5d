"""The command lines of `python -m models.info` and `python -m models.sample`, torch-free so that
`--help` and bad arguments are answered before torch is imported (see `models.cli`)."""

from __future__ import annotations

import argparse
import string

from models.cli import (NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, Parser, add_ckpt_arguments,
                        add_json_argument)

# Tiny Shakespeare's 65 characters first (so d_vocab=65 gives exactly its vocabulary), then the
# rest of printable ASCII: 96 characters in all. The vocabulary `models.info --save` writes.
SHAKESPEARE_CHARS = "\n !$&',-.3:;?" + string.ascii_uppercase + string.ascii_lowercase
CHAR_ALPHABET = SHAKESPEARE_CHARS + "".join(
    c for c in string.printable if c not in SHAKESPEARE_CHARS and c not in "\t\r\x0b\x0c")
DEFAULT_SEQ_LEN = 8

INFO_EXAMPLES = """examples:
  python -m models.info --list-presets
  python -m models.info --preset tiny_shakespeare_gpt_small
  python -m models.info --ckpt checkpoints/shakespeare_rms4 --no-hooks --json
"""
SAMPLE_EXAMPLES = """examples:
  python -m models.sample --ckpt checkpoints/shakespeare_rms4 --prompt "ROMEO:" --tokens 200
  python -m models.sample --ckpt checkpoints/shakespeare_gpt --prompt "ROMEO:" --greedy
"""


def _info_input(args: argparse.Namespace) -> str | None:
    if args.list_presets:
        return None
    if args.ckpt is None and args.preset is None:
        return "give --preset NAME or --ckpt PATH (or --list-presets)"
    if args.ckpt is not None and args.save:
        return "--save saves a freshly built --preset; leave out --ckpt"
    return None


def info_parser() -> Parser:
    parser = Parser(prog="python -m models.info", epilog=INFO_EXAMPLES, checks=[_info_input],
                    description="Describe a preset or checkpoint: its config, parameter count and "
                                "every hook with its shape. Hook shapes come from one run_with_cache "
                                "on a short dummy input (per-head hook_result switched on).")
    add_ckpt_arguments(parser, required=False,
                       preset_help="the preset to describe (a freshly built model), or with --ckpt "
                                   "the architecture of a series .pt state dict; names: --list-presets")
    parser.add_argument("--list-presets", action="store_true", help="list the preset names and exit")
    parser.add_argument("--hooks", action=argparse.BooleanOptionalAction, default=True,
                        help="run a dummy input and list every hook with its shape (default: on)")
    parser.add_argument("--seq-len", type=POSITIVE_INT, metavar="N",
                        help=f"dummy input length (default: min(n_ctx, {DEFAULT_SEQ_LEN}); "
                             "n_ctx for MLPs)")
    parser.add_argument("--save", metavar="DIR",
                        help="save the freshly built --preset as a snapshot in DIR (char vocabulary "
                             f"of d_vocab characters; d_vocab <= {len(CHAR_ALPHABET)})")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="torch seed for building a preset")
    add_json_argument(parser)
    return parser


def sample_parser() -> Parser:
    parser = Parser(prog="python -m models.sample", epilog=SAMPLE_EXAMPLES,
                    description="Continue a prompt with a model, greedy or sampled, the way the "
                                "series judged every model. Prints the prompt and its continuation.")
    add_ckpt_arguments(parser)
    parser.add_argument("--prompt", required=True,
                        help="text to continue (every character must be in the vocabulary)")
    parser.add_argument("--tokens", type=NON_NEGATIVE_INT, default=200, metavar="N",
                        help="how many tokens to generate")
    parser.add_argument("--temperature", type=POSITIVE_FLOAT, default=1.0, metavar="T",
                        help="sampling temperature: below 1 sharper, above 1 flatter")
    parser.add_argument("--top-k", type=POSITIVE_INT, default=None, metavar="K",
                        help="sample among the k most likely tokens only (default: all tokens)")
    parser.add_argument("--greedy", action="store_true",
                        help="always take the most likely token (no sampling)")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the draw")
    return parser
