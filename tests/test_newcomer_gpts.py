"""A newcomer's own GPTs (`tests/gpt_kit`: a Llama-style one and an einsum one), trained with
the Monitor and read back with `--model-code`: the CLIs read a text in windows of the context the
snapshot recorded where the module names none (and say so), and the tuned lens trains and reads on
them (refused in one line without their code)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from gpt_kit import EinsumGPT, LlamaGPT, train_with_monitor
from gpt_kit.einsum import CONTEXT

from models.tokenizers import CharTokenizer
from probes import degenerate, entropy, heads, tuned_lens
from probes.sources import source_of

KIT = Path(__file__).resolve().parent / "gpt_kit"
CODE = {"EinsumGPT": f"{KIT / 'einsum.py'}:EinsumGPT", "LlamaGPT": f"{KIT / 'llama.py'}:LlamaGPT"}  # --model-code
LINE = "the king and the queen shall not be what thou art.\n"
TEXT = LINE * 12
CHARS = CharTokenizer.from_text(TEXT)
READ = "the king and the queen shall not be what thou art"  # 49 tokens: fewer than the context of 64


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("newcomer")
    out = {}
    for cls in (EinsumGPT, LlamaGPT):
        torch.manual_seed(0)
        out[cls.__name__] = (root / cls.__name__, train_with_monitor(cls(vocab=CHARS.vocab_size), root / cls.__name__,
                                                                    CHARS, TEXT, steps=3, save_every=2))
    (root / "text.txt").write_text(TEXT * 4, encoding="utf-8")
    return out


def by_hand_entropy(model: EinsumGPT, ids: torch.Tensor) -> list[list[float]]:
    """Per layer and head, the mean over rows of -sum p ln p (eps 1e-10) of the einsum GPT's own
    softmax, computed here from its parts on one window: [layer][head]."""
    out = []
    with torch.no_grad():
        n = ids.shape[1]
        x = model.emb["tok"](ids) + model.emb["where"](torch.arange(n))
        for layer in model.layers:
            a, h = layer.attn, layer.norm1(x)
            q = a.to_q(h).view(1, n, a.n_heads, -1).transpose(1, 2).double()  # [1 head pos d_head]
            k = a.to_k(h).view(1, n, a.n_heads, -1).transpose(1, 2).double()
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            p = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf).softmax(-1)
            out.append((-(p * (p + 1e-10).log()).sum(-1)).mean(-1)[0].tolist())
            x = layer(x)
    return out


def test_a_module_naming_no_context_is_read_in_the_snapshots_recorded_context_and_said(runs, capsys):
    run, model = runs["EinsumGPT"]
    assert json.loads((run / "step_000000" / "config.json").read_text())["model"]["n_ctx"] == CONTEXT
    code = CODE["EinsumGPT"]
    ids = torch.tensor([CHARS.encode(READ)])  # [1 49]
    for probe in (entropy, degenerate, heads):
        assert probe.main(["--ckpt", str(run), "--model-code", code, "--text", READ, "--json"]) == 0
        out, err = capsys.readouterr()
        got = json.loads(out)
        assert (got["tokens"], got["windows"]) == (49, 1), probe.__name__  # was 7 windows of 8 tokens
        assert err.count("\n") == 1 and "EinsumGPT names no context" in err and f"windows of {CONTEXT} tokens, " \
            "the context its snapshot recorded" in err, err
        if probe is entropy:
            expected = by_hand_entropy(model, ids)
            for layer, row in enumerate(got["entropy"]):
                assert row == pytest.approx(expected[layer], rel=1e-5), layer  # float32 forward vs float64 by hand
    assert heads.main(["--ckpt", str(run), "--model-code", code, "--repeat", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["repeat_length"] == CONTEXT // 2  # was 4: half of the 8 tokens of the first check
    llama, _ = runs["LlamaGPT"]  # names its context (max_seq_len): nothing said
    assert entropy.main(["--ckpt", str(llama), "--model-code", CODE["LlamaGPT"], "--text", READ]) == 0
    assert "names no context" not in capsys.readouterr().err
    # a runner given the module alone: the rows given, else the first check's 8 tokens, each said
    assert "the length of the longest row given" in source_of(model, ids).context_said
    assert source_of(model, ids).dims.n_ctx == 49 and source_of(model).dims.n_ctx == 8
    assert source_of(model, context=CONTEXT).dims.n_ctx == CONTEXT
    assert source_of(LlamaGPT(vocab=CHARS.vocab_size)).context_said is None


def test_the_tuned_lens_trains_and_reads_on_a_users_gpt_with_its_code_and_says_one_line_without(runs, capsys):
    root = runs["EinsumGPT"][0].parent
    data = str(root / "text.txt")
    for name, (run, model) in runs.items():
        assert tuned_lens.main(["--ckpt", str(run), "--data", data, "--steps", "2"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"--model-code path/to/your_file.py:{name}" in err, err
        args = ["--ckpt", str(run), "--model-code", CODE[name], "--data", data, "--samples", "4", "--json"]
        assert tuned_lens.main([*args, "--steps", "3"]) == 0
        trained = json.loads(capsys.readouterr().out)
        assert tuned_lens.main([*args, "--eval"]) == 0
        read = json.loads(capsys.readouterr().out)
        assert read["tuned_lens"] == trained["tuned_lens"] and len(read["layers"]) == 3
        # the last point is the model's own readout, translated by nothing: the two lenses agree there
        assert read["tuned_lens"]["kl_to_final"][-1] == pytest.approx(read["logit_lens"]["kl_to_final"][-1], abs=1e-6)
        lens = tuned_lens.TunedLens(model)  # identity translators: exactly the logit lens
        assert lens.d_model == 32 and lens.n_translators == 2


def test_a_tied_table_is_counted_once_with_and_without_the_code(runs, capsys):
    from models import info
    from models.checkpoint import load_checkpoint
    from models.layout import parameter_count

    run, model = runs["LlamaGPT"]
    v, d = CHARS.vocab_size, 32
    by_hand = v * d + 2 * (2 * d + 3 * d * d + d * d + 3 * (2 * d * d)) + d  # table once, 2 blocks, final norm
    assert parameter_count(model) == by_hand
    for code in ([], ["--model-code", CODE["LlamaGPT"]]):
        assert info.main(["--ckpt", str(run), "--json", *code]) == 0
        assert json.loads(capsys.readouterr().out)["n_params"] == by_hand, code  # was by_hand + v * d without code
    saved = load_checkpoint(run).model  # what the Overview counts: the tied copy read back once
    assert type(saved).__name__ == "SavedModel" and parameter_count(saved) == by_hand
    einsum, _ = runs["EinsumGPT"]  # untied: both tables count
    assert parameter_count(load_checkpoint(einsum).model) == parameter_count(runs["EinsumGPT"][1])
