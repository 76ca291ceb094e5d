"""Generation (models.sample) on a stand-in model whose next token is known, and the PCA map
(probes.projection) on tables whose principal axes are known."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from models.sample import generate
from probes.projection import pca_2d

REPO = Path(__file__).resolve().parent.parent


class NextIsPlusOne(torch.nn.Module):
    """Logits that put all mass on (token + 1) mod V at every position; records input lengths."""

    def __init__(self, vocab: int = 7, n_ctx: int = 4, family: str = "transformer", margin: float = 3.0):
        super().__init__()
        self.cfg = SimpleNamespace(family=family, n_ctx=n_ctx, d_vocab=vocab)
        self.margin = margin
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.lengths: list[int] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [1 pos] -> [1 pos vocab]
        self.lengths.append(tokens.shape[1])
        return torch.nn.functional.one_hot((tokens + 1) % self.cfg.d_vocab, self.cfg.d_vocab).float() * self.margin


def test_greedy_follows_the_known_next_token_and_reads_at_most_n_ctx():
    model = NextIsPlusOne()
    out = generate(model, torch.tensor([[5]]), 6, greedy=True)
    assert out.tolist() == [[5, 6, 0, 1, 2, 3, 4]]
    assert max(model.lengths) == 4  # the window is cropped to the context


def test_sampling_is_repeatable_by_seed_and_top_k_1_is_greedy():
    model = NextIsPlusOne(margin=1.0)  # soft: sampling really draws other tokens
    a = generate(model, torch.tensor([[0]]), 30, temperature=1.0, seed=3)
    b = generate(model, torch.tensor([[0]]), 30, temperature=1.0, seed=3)
    c = generate(model, torch.tensor([[0]]), 30, temperature=1.0, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = generate(model, torch.tensor([[0]]), 10, greedy=True)
    assert torch.equal(generate(model, torch.tensor([[0]]), 10, top_k=1, seed=0), greedy)


def test_generation_refuses_bad_settings_and_a_diverged_model():
    model = NextIsPlusOne()
    with pytest.raises(ValueError, match="temperature"):
        generate(model, torch.tensor([[0]]), 3, temperature=0.0)
    with pytest.raises(ValueError, match="at least 4"):
        generate(NextIsPlusOne(family="mlp"), torch.tensor([[0, 1]]), 3)
    nan = NextIsPlusOne(margin=float("nan"))
    with pytest.raises(ValueError, match="NaN or inf"):
        generate(nan, torch.tensor([[0]]), 2, greedy=True)


def test_sample_cli_on_a_shipped_run_and_bad_input(capsys):
    proc = subprocess.run([sys.executable, "-m", "models.sample", "--ckpt", "checkpoints/shakespeare_rms4",
                           "--prompt", "ROMEO:", "--tokens", "20", "--greedy"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # once as users run it
    assert proc.returncode == 0 and proc.stdout.startswith("ROMEO:") and len(proc.stdout) > 20
    from models.sample import main

    def run(*args: str) -> tuple[int, str, str]:  # the same entry point in this process: no second startup
        code = main(["--ckpt", str(REPO / "checkpoints" / "shakespeare_rms4"), *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    assert run("--prompt", "ROMEO:", "--tokens", "20", "--seed", "1")[1] == \
        run("--prompt", "ROMEO:", "--tokens", "20", "--seed", "1")[1]
    for args, message in ((("--prompt", "héllo"), "é"), (("--prompt", "x", "--temperature", "0"), "temperature")):
        code, _, err = run(*args)
        assert code == 2 and err.startswith("error:") and message in err


def test_pca_of_points_on_a_line_and_a_plane():
    line = torch.tensor([[-1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    coords, explained = pca_2d(line)
    assert explained.tolist() == pytest.approx([1.0, 0.0])
    assert coords[:, 0].tolist() == pytest.approx([1.0, -1.0, 0.0])  # sign: the first row is positive
    plane = torch.tensor([[3.0, 0, 0], [-3.0, 0, 0], [0, 1.0, 0], [0, -1.0, 0]])
    coords, explained = pca_2d(plane)
    assert explained.tolist() == pytest.approx([18 / 20, 2 / 20])
    assert coords.abs().flatten().tolist() == pytest.approx([3, 0, 3, 0, 0, 1, 0, 1], abs=1e-6)
    with pytest.raises(ValueError, match="NaN"):
        pca_2d(torch.tensor([[float("nan"), 0.0], [1.0, 1.0]]))
