"""probes.heads: agreement with transformer_lens's head_detector, a hand-built induction circuit,
the link to probes.degenerate, TransformerBridge models, bad input and the CLI.

Reference: TransformerLens 4.3 has no HookedTransformer, and `detect_head` reads `cfg.device` /
`cfg.dtype`, which our configs lack; so `detect_head` itself is called through `TLShim` (those two
fields plus `to_tokens` and `run_with_cache` handed to our model, whose cache is a TransformerLens
ActivationCache). On a bridge (no tokenizer, so no `to_tokens`), the reference is head_detector's
own detection-pattern builders and `compute_head_attention_similarity_score` on the bridge's
cached patterns, window by window.
"""

from __future__ import annotations

import json
import math
import types

import pytest
import torch
from llama_kit import llama  # noqa: F401  (fixture: a bias-free Llama-family bridge, GQA)
from test_interop import BRIDGE_CFG, bridge  # noqa: F401  (fixture: a TransformerBridge)
from transformer_lens import head_detector as hd

from models import Transformer, TransformerConfig, build_model, get_preset
from models.tokenizers import CharTokenizer
from probes import degenerate, heads
from probes.common import random_repeat_tokens
from probes.common import ProbeInputError

TL_NAMES = {"previous_token": "previous_token_head", "duplicate_token": "duplicate_token_head",
            "induction": "induction_head"}
ALPHABET = "abcdefgh ,.:;!?ABCDEFGH"
PROMPTS = ["abc abc abd. abc", "ABBA ABBA, ba ba", "a;b;c;a;b;c;a"]


class TLShim:
    """What detect_head reads from a HookedTransformer: cfg.device/dtype/n_layers/n_heads/n_ctx,
    to_tokens and run_with_cache (ours, returning an ActivationCache)."""

    def __init__(self, model):
        self.model = model
        self.cfg = types.SimpleNamespace(device="cpu", dtype=torch.float32, n_layers=model.cfg.n_layers,
                                         n_heads=model.cfg.n_heads, n_ctx=model.cfg.n_ctx)

    def to_tokens(self, text):  # a list only has its shape read before each prompt is run alone
        if isinstance(text, list):
            return torch.cat([self.model.to_tokens(t) for t in text])
        return self.model.to_tokens(text)

    def run_with_cache(self, *args, **kwargs):
        return self.model.run_with_cache(*args, **kwargs)


@pytest.fixture(scope="module")
def random_gpt():
    """A GPT with random weights and a character tokenizer (random weights, sharpened so that the
    patterns are far from uniform and every score is tested away from its trivial value)."""
    cfg = get_preset("tiny_shakespeare_gpt_small", d_vocab=len(ALPHABET), n_layers=2, n_ctx=24)
    torch.manual_seed(1)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attention.W_QKV.mul_(15.0)
    model.tokenizer = CharTokenizer(ALPHABET)
    return model


@pytest.mark.parametrize("measure", ["mul", "abs"])
@pytest.mark.parametrize("exclude", [(False, False), (True, False), (False, True), (True, True)])
def test_scores_equal_detect_head_for_each_builtin_type(random_gpt, measure, exclude):
    bos, current = exclude
    for prompt in PROMPTS:
        ours = heads.run(random_gpt, prompt, error_measure=measure, exclude_bos=bos,
                         exclude_current_token=current, copying=False)
        for name, tl_name in TL_NAMES.items():
            ref = hd.detect_head(TLShim(random_gpt), prompt, tl_name, exclude_bos=bos,
                                 exclude_current_token=current, error_measure=measure)
            torch.testing.assert_close(torch.tensor(ours.scores[name]), ref, atol=1e-6, rtol=0)
    spread = torch.tensor(ours.scores["previous_token"])
    assert spread.max() - spread.min() > 0.05  # the heads differ: the comparison means something


def test_many_windows_average_as_detect_head_on_a_list(random_gpt):
    ids = [random_gpt.to_tokens(p)[0] for p in PROMPTS[:2]]
    assert len(ids[0]) == len(ids[1])  # one [2 pos] batch
    ours = heads.run(random_gpt, torch.stack(ids), copying=False)
    for name, tl_name in TL_NAMES.items():
        ref = hd.detect_head(TLShim(random_gpt), PROMPTS[:2], tl_name)
        torch.testing.assert_close(torch.tensor(ours.scores[name]), ref, atol=1e-6, rtol=0)


def test_detection_patterns_equal_head_detectors():
    tokens = torch.randint(0, 5, (3, 12), generator=torch.Generator().manual_seed(0))
    ours = heads.detection_patterns(tokens)
    for b in range(3):
        row = tokens[b:b + 1]
        assert torch.equal(ours["previous_token"][b], hd.get_previous_token_head_detection_pattern(row))
        assert torch.equal(ours["duplicate_token"][b], hd.get_duplicate_token_head_detection_pattern(row))
        assert torch.equal(ours["induction"][b], hd.get_induction_head_detection_pattern(row))
    assert ours["duplicate_token"].sum() > 0 and ours["induction"].sum() > 0


def test_bridge_scores_equal_head_detector_on_its_patterns(bridge):  # noqa: F811
    tokens = torch.randint(0, BRIDGE_CFG["d_vocab"], (3, 12), generator=torch.Generator().manual_seed(4))
    tokens[:, 6:] = tokens[:, :6]  # repeats, so duplicate and induction patterns are not empty
    result = heads.run(bridge, tokens, repeat_period=6)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens)
    builders = {"previous_token": hd.get_previous_token_head_detection_pattern,
                "duplicate_token": hd.get_duplicate_token_head_detection_pattern,
                "induction": hd.get_induction_head_detection_pattern,
                "sink": lambda t: heads.fixed_detection("sink", t.shape[-1])}
    for name, build in builders.items():
        ref = torch.zeros(BRIDGE_CFG["n_layers"], BRIDGE_CFG["n_heads"])
        for b in range(3):
            det = build(tokens[b:b + 1])
            for l in range(BRIDGE_CFG["n_layers"]):
                for h in range(BRIDGE_CFG["n_heads"]):
                    ref[l, h] += hd.compute_head_attention_similarity_score(
                        cache["pattern", l][b, h], det, exclude_bos=False, exclude_current_token=False,
                        error_measure="mul") / 3
        torch.testing.assert_close(torch.tensor(result.scores[name]), ref, atol=1e-6, rtol=0)
    olsson = torch.stack([cache["pattern", l][:, :, 6:, 1:7].diagonal(dim1=-2, dim2=-1).mean((0, -1))
                          for l in range(BRIDGE_CFG["n_layers"])])  # P[i, i - 5] for i >= 6
    torch.testing.assert_close(torch.tensor(result.induction_repeat), olsson, atol=1e-6, rtol=0)
    assert result.copying is not None and all(-1 <= c <= 1 for row in result.copying for c in row)


def test_copying_scores_with_grouped_query_attention_equal_transformer_lens_ov_circuits(llama):  # noqa: F811
    """4 query heads share 2 kv heads (W_V [2 d_model d_head]): each query head's OV circuit uses
    its group's W_V. The reference: the eigenvalues of TransformerLens's own W_E OV W_U."""
    with torch.no_grad():
        eig = (llama.W_E @ llama.OV @ llama.W_U).eigenvalues  # [layer head d_head]
    ref = eig.real.sum(-1) / eig.abs().sum(-1)
    ours = heads.model_copying_scores(llama)
    assert ours is not None
    torch.testing.assert_close(torch.tensor(ours, dtype=torch.float64), ref.detach().double(), atol=1e-5, rtol=0)
    assert float(ref.abs().max()) > 0.05


# ---------------------------------------------------------------- a hand-built induction circuit

V, N = 128, 16  # vocabulary, context


def induction_model() -> Transformer:
    """Two attention layers on a residual of [token V | position N | previous token V | one].

    Layer 0's head attends from i to i-1 (query: position i, key: position j+1) and copies the
    token there into the previous-token slot; layer 1's head attends from i to every j whose
    previous token is i's own token (query: token, key: previous token), i.e. to the token after
    an earlier copy. Position 0 has no previous token, so layer 1's keys push it down through the
    constant slot. Zero MLPs, no norms, no scale: each score is 20 or 0 on paper."""
    d = 2 * V + N + 1
    tok, pos, prev, one = slice(0, V), slice(V, V + N), slice(V + N, 2 * V + N), 2 * V + N
    cfg = TransformerConfig(d_vocab=V, n_ctx=N, d_model=d, n_layers=2, n_heads=1, d_head=V + 1, d_mlp=4,
                            norm="none", attn_scale="none", residual=True)
    model = Transformer(cfg).eval()
    c = 20.0
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embedding.weight[:, tok] = torch.eye(V)
        model.embedding.weight[:, one] = 1.0
        model.W_pos[:, pos] = torch.eye(N)
        h0, h1 = model.blocks[0].attention.heads[0], model.blocks[1].attention.heads[0]
        h0.W_Q[pos, :N] = c * torch.eye(N)  # q_i = c e_i
        h0.W_K[pos, :N] = torch.diag(torch.ones(N - 1), 1)  # k_j = e_{j+1}
        h0.W_V[tok, :V] = torch.eye(V)
        model.blocks[0].attention.W_O[:V, prev] = torch.eye(V)  # head 0 writes its token to `prev`
        h1.W_Q[tok, :V] = c * torch.eye(V)  # q_i = c e_{t_i}
        h1.W_K[prev, :V] = torch.eye(V)  # k_j = e_{t_{j-1}}
        h1.W_Q[one, V] = c  # ... and a constant query component that only position 0's key meets
        h1.W_K[V, V] = -3.0  # key of position 0: -3 on it (-60 against the query's 20)
    return model


def test_a_hand_built_induction_head_scores_above_0_9_and_a_random_one_below_0_2():
    model = induction_model()
    built = heads.run_repeat(model, length=N // 2, samples=32, seed=0)
    assert built.induction_repeat[1][0] > 0.9, built.induction_repeat
    assert built.scores["previous_token"][0][0] > 0.9  # its first layer is a previous-token head
    assert built.induction_repeat[0][0] < 0.2
    torch.manual_seed(0)
    random = build_model(get_preset("tiny_shakespeare_gpt_small", n_ctx=N, d_vocab=V)).eval()
    scores = torch.tensor(heads.run_repeat(random, length=N // 2, samples=32, seed=0).induction_repeat)
    assert scores.max() < 0.2, scores


def test_random_repeat_tokens_are_seeded_and_repeat():
    a = random_repeat_tokens(50, 7, batch=3, seed=5)
    assert a.shape == (3, 14) and torch.equal(a[:, :7], a[:, 7:])
    assert torch.equal(a, random_repeat_tokens(50, 7, batch=3, seed=5))
    assert not torch.equal(a, random_repeat_tokens(50, 7, batch=3, seed=6))
    assert int(a.max()) < 50


# ---------------------------------------------------------------- degenerate reads these definitions

def test_degenerate_sink_and_previous_evidence_are_the_head_scores(random_gpt):
    tokens = torch.randint(0, len(ALPHABET), (4, 24), generator=torch.Generator().manual_seed(2))
    scores = heads.run(random_gpt, tokens, copying=False).scores
    n = tokens.shape[1]
    for route in ("pattern", "qk"):
        ev = degenerate.run(random_gpt, tokens, route=route).evidence
        torch.testing.assert_close(torch.tensor(ev["sink_score"]), torch.tensor(scores["sink"]),
                                   atol=1e-6, rtol=0, check_dtype=False)
        # mul score = sum_i P[i, i-1] / n; the verdict's evidence averages rows 1.. only
        torch.testing.assert_close(torch.tensor(ev["subdiag_mass"]) * (n - 1) / n,
                                   torch.tensor(scores["previous_token"]), atol=1e-6, rtol=0,
                                   check_dtype=False)


def test_previous_token_rows_of_a_block_match_the_full_pattern():
    p = torch.rand(2, 3, 10, 10).tril().softmax(-1)
    full = heads.previous_token_rows(p)
    assert full[..., 0].eq(0).all()
    torch.testing.assert_close(full[..., 1:], p.diagonal(offset=-1, dim1=-2, dim2=-1))
    torch.testing.assert_close(heads.previous_token_rows(p[..., 4:8, :8], first_row=4), full[..., 4:8])


# ---------------------------------------------------------------- bad input and the CLI

def test_bad_input_is_a_probe_input_error(random_gpt):
    with pytest.raises(ProbeInputError, match="no attention"):
        heads.run(build_model(get_preset("char_mlp_small")), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ProbeInputError, match="context"):
        heads.run_repeat(random_gpt, length=13)
    with pytest.raises(ProbeInputError, match="outside the vocabulary"):
        heads.run(random_gpt, torch.tensor([[0, 1, 99]]))
    with pytest.raises(ProbeInputError, match="error_measure"):
        heads.run(random_gpt, torch.tensor([[0, 1, 2]]), error_measure="max")


def test_cli_repeat_json_and_bad_input(capsys):
    assert heads.main(["--ckpt", "checkpoints/shakespeare_gpt", "--repeat", "--length", "8",
                       "--samples", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["scores"]) == set(heads.HEAD_TYPES) and out["repeat_length"] == 8
    grid = out["induction_repeat"]
    assert len(grid) == 4 and len(grid[0]) == 6 and all(0 <= v <= 1 for row in grid for v in row)
    assert all(math.isfinite(v) for row in out["copying"] for v in row)
    assert heads.main(["--ckpt", "checkpoints/shakespeare_gpt", "--repeat", "--length", "40"]) == 2
    err = capsys.readouterr().err.strip()
    assert "context of 64" in err and "\n" not in err
    assert heads.main(["--ckpt", "checkpoints/char_mlp", "--text", "ROMEO"]) == 2
    assert "no attention" in capsys.readouterr().err
    assert heads.main(["--ckpt", "checkpoints/shakespeare_gpt", "--repeat", "--text", "x"]) == 2
    assert "leave out --text" in capsys.readouterr().err


def test_cli_text_table(capsys):
    assert heads.main(["--ckpt", "checkpoints/shakespeare_gpt", "--text", "ROMEO: But soft, ROMEO: But"]) == 0
    out = capsys.readouterr().out
    for name in ("previous_token:", "duplicate_token:", "induction:", "sink:", "copying"):
        assert name in out
