"""Every CLI answers --help and bad arguments before importing torch or TransformerLens, in one
line and exit 2 for the latter; every flag has a help text that shows its default; the example
commands in each --help parse."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from models.cli import FRACTION, POSITIVE_INT, HelpFormatter, Parser, UsageError, number_type

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformer_lens")
# python -m X -> (module with build_parser, a command line its parser refuses, the flag it names)
CLIS = {
    "probes.entropy": ("probes.entropy", ["--ckpt", "x", "--text", "a", "--batch-size", "0"], "--batch-size"),
    "probes.degenerate": ("probes.degenerate", ["--ckpt", "x", "--sink-mass", "2"], "--sink-mass"),
    "probes.neighbours": ("probes.neighbours", ["--ckpt", "x", "--id", "1", "--chunk-size", "0"], "--chunk-size"),
    "probes.logit_lens": ("probes.logit_lens", ["--ckpt", "x", "--text", "a", "--columns", "0"], "--columns"),
    "probes.heads": ("probes.heads", ["--ckpt", "x", "--repeat", "--length", "1"], "--length"),
    "probes.attribution": ("probes.attribution", ["--ckpt", "x", "--text", "a", "--top", "0"], "--top"),
    "probes.updates": ("probes.updates", ["--ckpt", "x", "--band", "-2", "-4"], "--band"),
    "probes.activations": ("probes.activations", ["--ckpt", "x", "--saturation", "1"], "--saturation"),
    "probes.diagnose": ("probes.diagnose", ["--ckpt", "x", "--step", "-1"], "--step"),
    "probes.tuned_lens": ("probes.tuned_lens", ["--ckpt", "x", "--steps", "0"], "--steps"),
    "probes.development": ("probes.development", ["--ckpt", "x", "--samples", "0"], "--samples"),
    "probes.patching": ("probes.patching.cli", ["--ckpt", "x", "--clean", "a", "--corrupt", "b", "--answer", "c",
                                                "--atp-star"], "--atp-star"),
    "probes.ablate": ("probes.ablate", ["--ckpt", "x", "--heads", "1-0"], "--heads"),
    "models.info": ("models.info", ["--preset", "mha4_small", "--seq-len", "0"], "--seq-len"),
    "models.sample": ("models.sample", ["--ckpt", "x", "--prompt", "a", "--temperature", "0"], "--temperature"),
    "train": ("train.loop", ["--out", "x", "--no-such-flag"], "--no-such-flag"),
    "train.sweep": ("train.sweep.cli", ["--out", "x", "--lr", "1e-3,0"], "--lr"),
    "probes.sweep": ("probes.sweep", ["--ckpt", "x", "--no-such-flag"], "--no-such-flag"),
}
# Runs `python -m MODULE ARGS...` through runpy as -m does and, whatever the exit, writes which
# heavy modules were imported to a file (stderr is under test, so not there).
WRAPPER = """
import atexit, json, runpy, sys
module, report = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(report, "w").write(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules))))
sys.argv = [module] + sys.argv[3:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
""".format(heavy=HEAVY)


def run_cli(module: str, args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    report = tmp_path / "imported.json"
    proc = subprocess.run([sys.executable, "-c", WRAPPER, module, str(report), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    return proc, json.loads(report.read_text())


@pytest.mark.parametrize("module", CLIS)
def test_help_exits_0_without_importing_torch(module, tmp_path):
    proc, imported = run_cli(module, ["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m {module}") and "examples:" in proc.stdout
    assert imported == []


@pytest.mark.parametrize("module", CLIS)
def test_a_bad_argument_is_one_line_exit_2_without_importing_torch(module, tmp_path):
    _, argv, flag = CLIS[module]
    proc, imported = run_cli(module, argv, tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and flag in proc.stderr
    assert imported == []


def test_the_wrapper_does_see_torch_when_a_cli_imports_it(tmp_path):
    """Guards the two tests above: past the parser, the same wrapper reports torch."""
    proc, imported = run_cli("probes.entropy", ["--ckpt", str(tmp_path / "missing"), "--text", "a"], tmp_path)
    assert proc.returncode == 2 and "not found" in proc.stderr
    assert "torch" in imported


def parsers() -> list[tuple[str, Parser]]:
    return [(name, importlib.import_module(module).build_parser()) for name, (module, _, _) in CLIS.items()]


@pytest.mark.parametrize("name, parser", parsers())
def test_every_flag_has_help_and_shows_its_default(name, parser):
    formatter = HelpFormatter(parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._get_help_string(action)
        assert text and text.strip() == text, (name, action.dest)
        has_default = not any(action.default is v for v in (None, False)) and action.default != []
        assert not has_default or "default" in text, (name, action.dest, action.default)
    assert parser.description.endswith(".")  # full sentences, not a docstring's first line


@pytest.mark.parametrize("name, parser", parsers())
def test_the_example_commands_in_the_help_parse(name, parser):
    lines = parser.epilog.splitlines()
    assert lines[0] == "examples:" and len(lines) >= 2
    for line in lines[1:]:
        words = shlex.split(line)
        start = words.index(name) + 1  # after `python -m NAME` (or torchrun's `-m NAME`)
        assert isinstance(parser.parse_args(words[start:]), argparse.Namespace)


def test_degenerate_help_says_no_input_gives_the_training_timeline():
    help_text = " ".join(importlib.import_module("probes.degenerate").build_parser().format_help().split())
    assert "Leave out the input and give a run directory as --ckpt for its training timeline" in help_text


def test_number_types_accept_the_range_and_name_the_problem():
    assert POSITIVE_INT("1") == 1 and FRACTION("0") == 0.0 and FRACTION("1") == 1.0
    batch = number_type(int, low=1, high=8, noun="batch size")
    assert batch("8") == 8
    for parse, text, message in [(POSITIVE_INT, "0", "0 is not an integer >= 1"),
                                 (POSITIVE_INT, "1.5", "1.5 is not an integer >= 1"),
                                 (FRACTION, "nan", "nan is not a number in [0, 1]"),
                                 (FRACTION, "1.01", "1.01 is not a number in [0, 1]"),
                                 (number_type(float, above=0, below=1), "1", "1 is not a number > 0 and < 1"),
                                 (batch, "9", "batch size 9 is not an integer in [1, 8]")]:
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(message)}$"):
            parse(text)


@pytest.mark.parametrize("name, parser", parsers())
def test_an_empty_path_is_refused_not_read_as_the_current_directory(name, parser):
    flags = [a.option_strings[0] for a in parser._actions
             if a.option_strings and a.option_strings[0] in ("--ckpt", "--out", "--data", "--text-file", "--log", "--config")]
    assert flags or name == "models.info"
    for flag in flags:  # `--ckpt ""` read "." before: ".: expected a snapshot directory ..."
        with pytest.raises(UsageError, match=f"^argument {flag}: the path is empty \\(an unset shell variable\\?\\)"):
            parser.parse_args([flag, ""])


def test_an_empty_checkpoint_path_is_refused_by_the_library_too():
    from models.checkpoint import CheckpointError, load_checkpoint

    with pytest.raises(CheckpointError, match="^the checkpoint path is empty"):
        load_checkpoint("")


def test_parser_errors_and_checks_are_one_line_usage_errors():
    parser = Parser(prog="demo", checks=[lambda a: "--lo must be below --hi" if a.lo >= a.hi else None])
    parser.add_argument("--lo", type=int, default=0)
    parser.add_argument("--hi", type=int, default=1)
    assert vars(parser.parse_args(["--lo", "-3"])) == {"lo": -3, "hi": 1}
    with pytest.raises(UsageError, match=r"^--lo must be below --hi \(see demo --help\)$"):
        parser.parse_args(["--lo", "5"])
    with pytest.raises(UsageError, match="^unrecognized arguments: --x"):
        parser.parse_args(["--x"])


def test_the_choices_copied_into_the_parsers_match_the_library():
    from probes import args, neighbours, updates

    assert args.NEIGHBOUR_TABLES == neighbours.TABLES
    assert args.STEP_OPTIMIZERS == tuple(sorted(updates.OPTIMIZERS))


def test_models_loads_its_model_classes_on_first_use():
    import models
    from models.transformer import Transformer

    assert models.Transformer is Transformer and "MLPLanguageModel" in dir(models)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        models.nope  # noqa: B018


def test_skip_init_leaves_tensors_alone_inside_only():
    import torch

    from models.store.weights import SkipInit

    t = torch.zeros(4, 4)
    with SkipInit():
        assert torch.nn.init.normal_(t, std=1.0) is t
        torch.nn.init.kaiming_uniform_(t)
    assert t.eq(0).all()
    torch.nn.init.normal_(t, std=1.0)
    assert not t.eq(0).all()


def test_loading_a_shipped_run_does_not_import_torch_dynamo():
    """A meta-device normal_ imports torch._dynamo (seconds); the checked skeleton skips it."""
    code = ("import sys, torch; from models.checkpoint import load_checkpoint; "
            "load_checkpoint('checkpoints/shakespeare_rms4', device=torch.device('cpu')); "
            "print('torch._dynamo' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr
