"""The probes' command lines, torch-free: `python -m probes.<name> --help` and bad arguments are
answered before torch and TransformerLens are imported (see `models.cli`). Each probe module
re-exports its parser as `build_parser`; the shared argument groups live here once.
"""

from __future__ import annotations

import argparse

from models.cli import (FRACTION, NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, Parser,
                        add_ckpt_arguments, add_json_argument, number_type, path_type, path_text)
from probes.doctor.log_file import KNOWN_NAMES, parse_tag
from probes.thresholds import SATURATION, TIMELINE_COLLAPSE, TIMELINE_UNIFORM, Thresholds
from probes.update_parts.report import TARGET_BAND, band_in_order

MAX_BATCH = 65536  # windows in one forward pass (probes.common.check_batch_size says why)
NEIGHBOUR_TABLES = ("input", "output", "cross")  # probes.neighbours.TABLES is this tuple
STEP_OPTIMIZERS = ("adam", "adamw", "sgd")  # probes.updates.OPTIMIZERS (likewise)
RUN = "checkpoints/shakespeare_rms4"  # a shipped run, for the examples
DATA = "data/tinyshakespeare.txt"  # the shipped Tiny Shakespeare text (or your own file)


def probe_parser(name: str, description: str, *examples: str, **kwargs) -> Parser:
    """The parser of `python -m probes.<name>` with its --ckpt arguments and example commands."""
    epilog = "examples:\n" + "".join(f"  python -m probes.{name} {e}\n" for e in examples)
    parser = Parser(prog=f"python -m probes.{name}", description=description, epilog=epilog, **kwargs)
    add_ckpt_arguments(parser)
    return parser


def add_input_arguments(parser: argparse.ArgumentParser, default_samples: int = 64) -> None:
    """--text / --text-file / --data and how the windows are batched, plus --json."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--text", help="text to run the model on (windowed to the model's context)")
    group.add_argument("--text-file", type=path_type, metavar="PATH", help="read the text from this UTF-8 file")
    group.add_argument("--data", type=path_type, metavar="PATH",
                       help="a corpus file to sample --samples random windows from (default, with no "
                            "--text or --text-file: the validation split of the run's own data, else "
                            "data/tinyshakespeare.txt)")
    parser.add_argument("--samples", type=POSITIVE_INT, default=None, metavar="N",
                        help=f"windows sampled from --data (default {default_samples})")
    parser.set_defaults(samples_default=default_samples)
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed for sampling --data windows")
    parser.add_argument("--batch-size", type=number_type(int, low=1, high=MAX_BATCH, noun="batch size"),
                        default=16, metavar="N", help="windows per forward pass")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar over batches (default: on a terminal with 2+ batches)")
    add_json_argument(parser)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    # plain int: the range check needs the model, and its message names the model's range
    parser.add_argument("--layer", type=int, metavar="L",
                        help="report only this layer (0-based; default: all)")
    parser.add_argument("--head", type=int, metavar="H",
                        help="report only this head (0-based; default: all)")


def add_threshold_arguments(parser: argparse.ArgumentParser) -> None:
    d = Thresholds()
    group = parser.add_argument_group("thresholds (fractions in [0, 1]; see probes.thresholds.Thresholds)")
    flag = lambda name, default, text: group.add_argument(name, type=FRACTION, default=default,
                                                          metavar="X", help=text)
    flag("--collapse-entropy", d.collapse_entropy, "normalised entropy below this is one-hot")
    flag("--collapse-max-prob", d.collapse_max_prob, "mean max probability above this is one-hot")
    flag("--uniform-entropy", d.uniform_entropy, "normalised entropy above this is uniform")
    flag("--sink-mass", d.sink_mass, "mean mass on the first position above this is a sink")
    flag("--one-hot-mass", d.one_hot_mass, "diagonal / sub-diagonal mass above this is self / previous")
    flag("--sink-score", d.sink_score, "sink_score above this counts toward the sink rate (Gu et al.)")
    flag("--timeline-collapse", TIMELINE_COLLAPSE,
         "training timeline: logged entropy below this fraction of uniform is collapsed")
    flag("--timeline-uniform", TIMELINE_UNIFORM,
         "training timeline: logged entropy above this fraction of uniform is uniform")


def entropy_parser() -> Parser:
    parser = probe_parser(
        "entropy", "Attention entropy per layer and head (nats), as the series logged it, and "
        "normalised by ln(keys visible), on the given text or sampled windows.",
        f"--ckpt {RUN} --text 'ROMEO: But soft, what light'", f"--ckpt {RUN} --data {DATA} --json")
    add_input_arguments(parser)
    add_report_arguments(parser)
    parser.add_argument("--per-position", action="store_true",
                        help="also report the mean entropy at each query position")
    return parser


def degenerate_parser() -> Parser:
    parser = probe_parser(
        "degenerate", "Degenerate attention: a verdict per head (collapsed, uniform, sink, self, "
        "previous, diverged or healthy) with the numbers behind it, on the given input. Leave out "
        "the input and give a run directory as --ckpt for its training timeline instead: when each "
        "head's logged entropy collapsed, went uniform or went NaN (from metrics.jsonl). A run "
        "directory with input gives both.",
        f"--ckpt {RUN} --text 'ROMEO: But soft, what light'", f"--ckpt {RUN} --json")
    add_input_arguments(parser)
    add_report_arguments(parser)
    add_threshold_arguments(parser)
    return parser


def neighbours_parser() -> Parser:
    parser = probe_parser(
        "neighbours", "Embedding nearest neighbours by cosine similarity (self excluded): of one "
        "token, of an analogy A - B + C, or of every token.",
        f"--ckpt {RUN} --token e -k 5", f"--ckpt {RUN} --all --table cross --json")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--token", metavar="PIECE", help="the token as a vocabulary piece, e.g. ' the' or 'e'")
    what.add_argument("--id", type=int, metavar="N", help="the token as an integer id")
    what.add_argument("--analogy", nargs=3, metavar=("A", "B", "C"),
                      help="neighbours of A - B + C (pieces); A, B, C are excluded")
    what.add_argument("--analogy-ids", nargs=3, type=int, metavar=("A", "B", "C"),
                      help="the same analogy given as integer ids")
    what.add_argument("--all", action="store_true",
                      help="every token's neighbours (chunked; a progress bar on stderr)")
    parser.add_argument("-k", type=int, default=10, help="neighbours per token")
    parser.add_argument("--table", choices=NEIGHBOUR_TABLES, default="input",
                        help="input embedding, output (unembedding), or cross: the input row searched "
                             "among the unembedding columns")
    parser.add_argument("--chunk-size", type=POSITIVE_INT, metavar="N",
                        help="query rows per chunk in --all "
                             "(default: as many as fit in 128 MiB of similarities)")
    add_json_argument(parser)
    return parser


def logit_lens_parser() -> Parser:
    parser = probe_parser(
        "logit_lens", "Logit lens: what the residual stream after the embedding and after each "
        "block would predict if the model stopped there (top-k tokens, cross-entropy, "
        "KL to the final layer, rank of the next token).",
        f"--ckpt {RUN} --text 'ROMEO: But soft' -k 3", f"--ckpt {RUN} --data {DATA} --mid --json")
    add_input_arguments(parser, default_samples=8)
    parser.add_argument("-k", type=int, default=5, help="top tokens per layer and position")
    parser.add_argument("--mid", action="store_true", help="also decode mid-block (after attention)")
    parser.add_argument("--columns", type=POSITIVE_INT, default=8, metavar="N",
                        help="positions per row block of the grid")
    return parser


HEAD_ERROR_MEASURES = ("mul", "abs")  # probes.heads.ERROR_MEASURES is this tuple


def _repeat_alone(args: argparse.Namespace) -> str | None:
    given = [f for f in ("text", "text_file", "data") if getattr(args, f) is not None]
    if args.repeat and given:
        return f"--repeat makes its own input: leave out --{given[0].replace('_', '-')}"
    if args.length is not None and not args.repeat:
        return "--length applies to --repeat only"
    return None


def _confirm_on_repeat(args: argparse.Namespace) -> str | None:
    return "--confirm ablates heads on the random repeat: add --repeat" if args.confirm and not args.repeat else None


def heads_parser() -> Parser:
    parser = probe_parser(
        "heads", "Head types: previous-token, duplicate-token, induction and sink scores in [0, 1] "
        "per layer and head, as TransformerLens's detect_head scores them, on the given text or on "
        "random tokens repeated twice (--repeat: adds the induction score of Olsson et al.), plus "
        "each head's OV copying score.",
        "--ckpt checkpoints/shakespeare_gpt --repeat", f"--ckpt {RUN} --text 'ROMEO: But soft, ROMEO: But'",
        f"--ckpt {RUN} --data {DATA} --json", checks=[_repeat_alone, _confirm_on_repeat])
    add_input_arguments(parser, default_samples=16)
    parser.add_argument("--repeat", action="store_true",
                        help="random token ids from the model's vocabulary (--seed), --length of "
                             "them repeated twice, --samples sequences")
    parser.add_argument("--length", type=number_type(int, low=2, noun="length"), metavar="N",
                        help="random tokens before the repeat (default: half the context)")
    parser.add_argument("--error-measure", choices=HEAD_ERROR_MEASURES, default="mul",
                        help="detect_head's score: mul = fraction of attention on the pattern, "
                             "abs = 1 - mean |pattern - detection| per row")
    parser.add_argument("--exclude-bos", action="store_true", help="leave attention to position 0 out")
    parser.add_argument("--exclude-current-token", action="store_true",
                        help="leave attention of each token to itself out")
    parser.add_argument("--confirm", action="store_true",
                        help="with --repeat: ablate each head whose induction score is 0.3 or more, alone, and "
                             "report how much the repeat's second-half loss rises (confirmed from 0.1 nats)")
    return parser


def attribution_parser() -> Parser:
    parser = probe_parser(
        "attribution", "Direct logit attribution: each head's, each MLP's, the embeddings' and the "
        "biases' direct contribution to one token's logit at one position (through the final "
        "norm's scale, as TransformerLens's logit_attrs), summing to the logit; with --versus, "
        "to the difference of two tokens' logits.",
        "--ckpt checkpoints/shakespeare_gpt --text 'ROMEO:' --position -1",
        "--ckpt checkpoints/shakespeare_gpt --text 'ROMEO: But soft' --target ' ' --versus 'e' --json")
    parser.add_argument("--text", help="the prompt (at most one context of tokens; default: one window "
                                         "of the run's own text, see --data of the other probes)")
    parser.add_argument("--position", type=int, default=-1, metavar="P",
                        help="the position whose prediction is attributed (negative counts from the end)")
    parser.add_argument("--target", metavar="TOKEN",
                        help="the token whose logit is attributed (a vocabulary piece; default: the "
                             "true next token, or the top prediction at the last position)")
    parser.add_argument("--versus", metavar="TOKEN", help="attribute the logit difference target - this token")
    parser.add_argument("--top", type=POSITIVE_INT, default=10, metavar="N",
                        help="components listed by size in the table (all in --json)")
    add_json_argument(parser)
    return parser


def activations_parser() -> Parser:
    parser = probe_parser(
        "activations", "Activation health per MLP hidden layer: dead and saturated units, "
        "activation and gradient statistics (makemore's diagnostics).",
        f"--ckpt {RUN} --data {DATA}", "--ckpt checkpoints/char_mlp --text 'ROMEO: But soft' --no-grads")
    add_input_arguments(parser, default_samples=32)
    parser.add_argument("--saturation", type=number_type(float, above=0, below=1), default=SATURATION,
                        metavar="X", help="|tanh| above this counts as saturated")
    parser.add_argument("--no-grads", action="store_true", help="forward only: skip the gradient statistics")
    return parser


def _band_in_order(args: argparse.Namespace) -> str | None:
    lo, hi = args.band
    if not band_in_order(lo, hi):
        return f"--band must be two finite log10 values LO < HI, got {lo} {hi}"
    return None


def updates_parser() -> Parser:
    parser = probe_parser(
        "updates", "g / w / u per parameter: what training logged (a run directory as --ckpt), "
        "the difference of two snapshots (--between), or one optimizer step on a copy (on "
        "--text, --text-file or --data; a snapshot outside a run without them: its own text).",
        f"--ckpt {RUN}", f"--ckpt {RUN} --history", f"--ckpt {RUN} --text 'ROMEO: But soft' --optimizer adam",
        checks=[_band_in_order])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--step", type=NON_NEGATIVE_INT, metavar="N",
                      help="a logged step of the run (default: the latest)")
    mode.add_argument("--between", nargs=2, metavar=("A", "B"),
                      help="two snapshots: step numbers of the --ckpt run or snapshot paths")
    mode.add_argument("--history", action="store_true", help="median log10 u per group at every logged step")
    add_input_arguments(parser)
    parser.add_argument("--optimizer", choices=STEP_OPTIMIZERS, default="sgd",
                        help="optimizer of the one step taken on a copy")
    parser.add_argument("--lr", type=POSITIVE_FLOAT, default=1e-3, help="its learning rate")
    parser.add_argument("--band", nargs=2, type=float, metavar=("LO", "HI"), default=list(TARGET_BAND),
                        help="healthy band of log10(u) (default -4 -2: makemore's target is -3)")
    return parser


def diagnose_parser() -> Parser:
    examples = ["--ckpt checkpoints/transformer4_nan", "--ckpt checkpoints/transformer4_nan --step 3",
                f"--ckpt {RUN} --json", "--ckpt runs/x --fail-on warning",
                "--ckpt out-shakespeare-char --log train.log", "--log docs/nanogpt_diverged.log",
                "--ckpt hf-output/checkpoint-500", "--ckpt tb-logs --tag Loss/train=train_loss"]
    parser = Parser(
        prog="python -m probes.diagnose",
        description="The run doctor: read what a run logged (our metrics.jsonl and run.json, a Hugging "
                    "Face Trainer's trainer_state.json, TensorBoard event files or nanoGPT's printed log) "
                    "and say what went wrong, from which step, the evidence, the cause and what to change, "
                    "ranked by severity. Exit 0 whatever the verdict (see --fail-on), 2 for unusable input.",
        epilog="examples:\n" + "".join(f"  python -m probes.diagnose {e}\n" for e in examples),
        checks=[lambda a: None if a.ckpt or a.log else "give --ckpt PATH, --log FILE or both"])
    parser.add_argument("--ckpt", metavar="PATH", type=path_text,
                        help="a run directory (or a snapshot inside one: the run up to that snapshot), a "
                             "Trainer output directory or checkpoint-N/, a folder of TensorBoard event "
                             "files, or a nanoGPT ckpt.pt (or its folder) with its printed *.log beside it")
    parser.add_argument("--log", metavar="FILE", type=path_text,
                        help="the log to read instead of finding one under --ckpt: nanoGPT's printed "
                             "output (train.py ... | tee train.log), a trainer_state.json or an event file; "
                             "--ckpt may then be left out")
    parser.add_argument("--tag", action="append", type=tag_type, metavar="NAME=ours",
                        help="read a TensorBoard tag (or trainer_state.json key) as one of ours, e.g. "
                             f"Loss/train=train_loss (repeatable; ours: {', '.join(KNOWN_NAMES)})")
    parser.add_argument("--step", type=NON_NEGATIVE_INT, metavar="N",
                        help="diagnose the run up to step N only, as if it had stopped there")
    parser.add_argument("--fail-on", choices=("warning", "failed"),
                        help="exit 1 when a finding is at least this severe (for scripts and CI)")
    add_json_argument(parser)
    return parser


def tag_type(text: str) -> str:
    """--tag NAME=ours, checked while parsing (an unknown `ours` is named with the known ones)."""
    try:
        parse_tag(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def tuned_lens_parser() -> Parser:
    gpt = "checkpoints/shakespeare_gpt"
    parser = probe_parser(
        "tuned_lens", "Tuned lens (Belrose et al. 2023): train an affine translator per layer that "
        "maps the residual stream to the final layer's distribution (identity-initialised, KL to "
        "the final layer, on the run's own text), saved beside the snapshot as "
        "<snapshot>.tuned_lens.safetensors + .json; or read one with --eval. Either way, prints "
        "KL(final||layer) and cross-entropy per layer for the logit lens and the tuned lens on "
        "random windows of the validation split.",
        f"--ckpt {gpt} --eval --json", f"--ckpt {gpt} --steps 500 --lens runs/gpt_lens.safetensors")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--steps", type=POSITIVE_INT, metavar="N", help="train the translators for N batches")
    mode.add_argument("--eval", action="store_true", help="read the saved tuned lens instead of training")
    parser.add_argument("--data", type=path_type, metavar="PATH",
                        help="the text to train and evaluate on (default: the data the run's run.json "
                             "records, else data/tinyshakespeare.txt)")
    parser.add_argument("--lens", type=path_type, metavar="PATH",
                        help="the translators' .safetensors file (default: beside the snapshot)")
    parser.add_argument("--force", action="store_true",
                        help="replace a tuned lens already saved there (without it, training refuses)")
    parser.add_argument("--batch-size", type=number_type(int, low=1, high=MAX_BATCH, noun="batch size"),
                        default=16, metavar="N", help="windows per training step and per evaluation pass")
    parser.add_argument("--lr", type=POSITIVE_FLOAT, default=3e-3, help="Adam's learning rate (decayed linearly to 0)")
    parser.add_argument("--seed", type=int, default=0, metavar="N",
                        help="seed for the training windows (evaluation windows use seed + 1)")
    parser.add_argument("--samples", type=POSITIVE_INT, default=64, metavar="N",
                        help="validation windows to evaluate on")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar over training steps (default: on a terminal)")
    add_json_argument(parser)
    return parser


def development_parser() -> Parser:
    parser = Parser(prog="python -m probes.development", description=(
        "The run's development: per snapshot, each head's normalised entropy and head-type scores, the "
        "logit lens's KL per layer, the loss, the in-context score and the loss on a random repeat's second "
        "half; and the phase changes (a type score rising or falling sharply, heads grouped, aligned with "
        "the loss). Each snapshot's reading is cached beside it, keyed by the weights' hash."),
        epilog=f"examples:\n  python -m probes.development --ckpt {RUN}\n"
               "  python -m probes.development --ckpt runs/mine --json\n")
    parser.add_argument("--ckpt", required=True, type=path_type, metavar="RUN",
                        help="a run directory (step_*/ snapshots), a folder of nanoGPT ckpt_N.pt files or of "
                             "Hugging Face checkpoint-N/ directories, or one snapshot")
    parser.add_argument("--data", type=path_type, metavar="PATH",
                        help="a text file to sample --samples windows from (default: the validation split of "
                             "the run's own data, else data/tinyshakespeare.txt)")
    parser.add_argument("--samples", type=POSITIVE_INT, default=8, metavar="N", help="text windows (default 8)")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed for sampling the text windows")
    parser.add_argument("--no-cache", action="store_true",
                        help="read every snapshot again, neither reading nor writing development.json")
    parser.add_argument("--ablation", choices=("zero", "mean", "none"), default="zero",
                        help="ablate each phase change's heads at the snapshot ending it, their z set to 0 (zero, "
                             "the default) or to its mean (mean), and report the repeat's loss with and without "
                             "them; none: no ablation")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar over snapshots (default: on a terminal)")
    add_json_argument(parser)
    return parser
