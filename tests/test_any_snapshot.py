"""Snapshots of any model (the Monitor's save_every on a GPT a user wrote): what they hold, read
back without the user's code, checked against the model itself at the step it was saved:
- entropy from the model's own softmax (the kit's models keep their patterns);
- the logit lens by hand through the model's own final norm and unembedding (and softcap);
- neighbours as cosine over the model's own embedding rows;
and with `--model-code`, rebuilt from the user's code (never imported without it)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gpt_kit import ChatGPT, PerHeadGPT, SplitGPT, own_patterns, rms

from models.store import load_checkpoint
from models.tokenizers import CharTokenizer
from models.store.any_files import read_readings
from models.store.files import CheckpointError
from probes import degenerate, entropy, heads, logit_lens, neighbours
from train.monitor import Monitor

VOCAB, STEPS, SAVE = 40, 4, 2
CHARS = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz .,;:!?'-ABCDE")  # VOCAB characters
KINDS = {"per-head": PerHeadGPT, "split-qkv": SplitGPT, "nanochat-layout": ChatGPT}


def batch(seed: int, rows: int = 4, n: int = 21) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, n), generator=torch.Generator().manual_seed(seed))


def logits_of(out):
    return out[0] if isinstance(out, tuple) else out


def train(model: torch.nn.Module, out: Path, **monitor) -> torch.nn.Module:
    """STEPS steps of a plain loop with the Monitor's three lines, a snapshot every SAVE steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with Monitor(model, optimizer, out, log_every=1, eval_every=SAVE, save_every=SAVE, report=False,
                 eval_tokens=batch(99, 3, 20), model_args={"vocab": VOCAB}, **monitor) as m:
        for step in range(STEPS + 1):
            x = batch(step)
            loss = F.cross_entropy(logits_of(model(x[:, :-1])).flatten(0, 1), x[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            m.log(step, train_loss=loss.item())
    return model.eval()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("any")
    out = {}
    for name, cls in KINDS.items():
        torch.manual_seed(0)
        out[name] = (root / name, train(cls(vocab=VOCAB), root / name, tokenizer=CHARS))
    return out


def by_hand_lens(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per point (what block 0 reads, each block's output) the logits through the model's own final
    norm and unembedding, computed here from its parts; and the model's logits."""
    blocks = {PerHeadGPT: lambda m: list(m.trf_blocks), SplitGPT: lambda m: list(m.h),
              ChatGPT: lambda m: list(m.transformer["h"])}[type(model)](model)
    seen = []
    handles = [blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))]
    handles += [b.register_forward_hook(lambda mod, args, out: seen.append(out)) for b in blocks]
    with torch.no_grad():
        final = logits_of(model(ids))
        for h in handles:
            h.remove()
        if isinstance(model, PerHeadGPT):
            decode = lambda x: model.out_head(model.final_norm(x))  # noqa: E731
        elif isinstance(model, SplitGPT):
            decode = lambda x: model.lm_head(model.ln_f(x))  # noqa: E731
        else:  # rms norm without weights, then the softcap of its forward
            decode = lambda x: model.softcap * torch.tanh(model.lm_head(rms(x)) / model.softcap)  # noqa: E731
        return [decode(x) for x in seen], final


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_snapshot_reads_as_the_model_read_itself(runs, kind):
    run, model = runs[kind]
    assert sorted(p.name for p in run.glob("step_*")) == ["step_000000", "step_000002", "step_000004"]
    snap = load_checkpoint(run)  # its latest: the weights the loop ended with
    assert type(snap.model).__name__ == "SavedModel" and snap.step == STEPS
    assert (run / "step_000004" / "readings.safetensors").stat().st_size < 1_000_000
    ids = torch.from_numpy(read_readings(run / "step_000004")["sample.tokens"])  # [rows pos]
    assert torch.equal(ids, batch(99, 3, 20)) and snap.tokenizer.vocab_size == VOCAB
    assert snap.meta["readings"]["windows"] == ({"0": 8} if kind == "nanochat-layout" else {})  # ctx // 4
    # entropy: the model's own softmax, in the series' formula, against the saved patterns
    own = own_patterns(model, ids)  # [batch head q k] per layer
    expected = [(-(p * (p + 1e-10).log()).sum(-1)).mean(dim=(0, 2)) for p in own]
    got = entropy.run(snap.model, ids).entropy
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), torch.stack(expected).double(), rtol=1e-5, atol=0)
    # the lens: by hand through the model's own final norm and unembedding
    points, final = by_hand_lens(model, ids)
    lens = logit_lens.run(snap.model, ids, k=3)
    log_final = final.log_softmax(-1)
    for p, logits in enumerate(points):
        kl = (log_final.exp() * (log_final - logits.log_softmax(-1))).sum(-1).clamp_min(0).mean()
        ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        assert math.isclose(lens.kl_to_final[p], float(kl), rel_tol=1e-4, abs_tol=1e-6), (kind, p)
        assert math.isclose(lens.cross_entropy[p], float(ce), rel_tol=1e-5), (kind, p)
        assert [[c[0]["id"] for c in row] for row in lens.top_k()[p]] == logits.argmax(-1).tolist()
    # neighbours: cosine over the model's own rows, in both tables
    tables = {"input": [m for m in model.modules() if isinstance(m, torch.nn.Embedding)][0].weight,
              "output": [m for n, m in model.named_modules() if n.endswith(("out_head", "lm_head"))][0].weight}
    for table, rows in tables.items():
        found = neighbours.run(snap.model, 7, k=4, table=table).to_dict()["neighbours"]
        cos = F.cosine_similarity(rows[7:8].detach(), rows.detach(), dim=-1)
        cos[7] = -2  # itself excluded
        assert [n["id"] for n in found] == cos.topk(4).indices.tolist(), (kind, table)
        assert math.isclose(found[0]["cosine"], float(cos.max()), rel_tol=1e-5)


def test_verdicts_head_types_and_the_repeat_come_from_the_saved_patterns(runs):
    run, model = runs["split-qkv"]
    snap = load_checkpoint(run)
    ids = torch.from_numpy(read_readings(run / "step_000004")["sample.tokens"])
    live = degenerate.run(model, ids)  # the live model through the tap
    saved = degenerate.run(snap.model, ids)
    assert saved.verdicts == live.verdicts
    assert torch.allclose(torch.tensor(saved.evidence["max_prob"]), torch.tensor(live.evidence["max_prob"]))
    repeat = heads.run_repeat(snap.model, samples=8)  # the repeat the snapshot saved, whatever was asked
    again = heads.run(model, torch.from_numpy(read_readings(run / "step_000004")["repeat.tokens"]),
                      repeat_period=repeat.repeat_length)
    assert torch.allclose(torch.tensor(repeat.induction_repeat), torch.tensor(again.induction_repeat))
    assert repeat.repeat_length == 10 and repeat.windows == 3
    first = entropy.layer_patterns(snap.model, ids[:1, :7], 1)  # the first 7 positions of row 0
    assert torch.allclose(first, own_patterns(model, ids[:1, :7])[1][0].double(), atol=1e-6)


def test_other_text_needs_the_code_and_the_clis_say_how(runs, capsys):
    run, _ = runs["per-head"]
    for probe in (entropy, degenerate, heads, logit_lens):
        assert probe.main(["--ckpt", str(run), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)
        assert probe.main(["--ckpt", str(run), "--text", "abc"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--model-code path/to/your_file.py:PerHeadGPT" in err, err
    assert neighbours.main(["--ckpt", str(run), "--token", "c", "--table", "output"]) == 0
    assert "nearest neighbours of 'c'" in capsys.readouterr().out
    snap = load_checkpoint(run)
    with pytest.raises(ValueError, match="not its code"):
        snap.model(torch.zeros(1, 3, dtype=torch.long))


USER_CODE = '''
import pathlib, torch
pathlib.Path(MARK).write_text("imported")
class TinyGPT(torch.nn.Module):  # a tutorial's layout: per-head modules
    def __init__(self, vocab=50):
        super().__init__()
        import gpt_kit
        self.inner = gpt_kit.PerHeadGPT(vocab=vocab)
    def forward(self, idx):
        return self.inner(idx)
'''


def test_the_code_runs_only_on_the_users_word(tmp_path, monkeypatch, capsys):
    mark = tmp_path / "imported.txt"
    code = tmp_path / "mygpt.py"
    code.write_text(f"MARK = {str(mark)!r}\n" + USER_CODE)
    from models.store.model_code import build
    torch.manual_seed(0)
    model = train(build(f"{code}:TinyGPT", {"vocab": VOCAB}), tmp_path / "run")
    mark.unlink()
    for name in [m for m in sys.modules if m.startswith("scratchscope_model_code")]:
        monkeypatch.delitem(sys.modules, name)
    assert entropy.main(["--ckpt", str(tmp_path / "run")]) == 0 and not mark.exists()  # the saved sample, no import
    ids = torch.tensor([[ord(c) % VOCAB for c in "any text at all"]])
    snap = load_checkpoint(tmp_path / "run", model_code=f"{code}:TinyGPT")
    assert mark.exists() and type(snap.model).__name__ == "TinyGPT"
    got = entropy.run(snap.model, ids).entropy
    assert got == entropy.run(model, ids).entropy  # the same weights: the same numbers on any tokens
    capsys.readouterr()
    args = ["--ckpt", str(tmp_path / "run"), "--model-code"]
    assert logit_lens.main([*args, f"{code}:TinyGPT", "--text", "zz"]) == 2  # no tokenizer was given: one line
    assert "has no tokenizer" in capsys.readouterr().err
    for spec, said in ((f"{code}:Nope", "has no class or function named Nope"), ("mygpt", "expected FILE.py:NAME"),
                       (f"{tmp_path}/absent.py:TinyGPT", "is not a file")):
        with pytest.raises(CheckpointError, match=said):
            load_checkpoint(tmp_path / "run", model_code=spec)
    meta_path = tmp_path / "run" / "step_000004" / "config.json"  # another vocabulary than it was trained with
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "model_args": {"vocab": VOCAB + 1}}))
    with pytest.raises(CheckpointError, match=r"does not fit the weights of step_000004: size mismatch for ") as err:
        load_checkpoint(tmp_path / "run", model_code=f"{code}:TinyGPT")
    assert "\n" not in str(err.value)


def test_a_tutorial_shakespeare_gpts_readings_stay_under_a_megabyte(tmp_path):
    from train.monitor.save import sample_size
    assert sample_size(2, 6, 8, 256) == (2, 64) and sample_size(12, 12, 8, 1024) == (2, 16)  # 147 kB a row
    torch.manual_seed(0)
    model = PerHeadGPT(n_layers=2, n_heads=6, d=48, ctx=256, vocab=VOCAB)  # block_size 256, as the tutorial
    monitor = Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), tmp_path / "run", save_every=1,
                      eval_tokens=batch(1, 8, 256), report=False)
    saved = monitor.save(0)
    monitor.close()
    assert (saved / "readings.safetensors").stat().st_size < 1_000_000
    readings = read_readings(saved)
    assert readings["sample.pattern.1"].shape == (2, 6, 64, 64) and readings["repeat.tokens"].shape == (2, 64)


def nanochat_gpt():
    return pytest.importorskip("nanochat.gpt")  # its users have it; a clone on PYTHONPATH runs it here


def test_a_nanochat_gpt_snapshot_against_nanochats_own_parts(tmp_path):
    gpt = nanochat_gpt()
    torch.manual_seed(0)
    config = gpt.GPTConfig(sequence_len=32, vocab_size=VOCAB, n_layer=4, n_head=4, n_kv_head=2, n_embd=64,
                           window_pattern="SL")
    model = gpt.GPT(config)
    model.init_weights()
    train(model, tmp_path / "run")
    snap = load_checkpoint(tmp_path / "run")
    ids = torch.from_numpy(read_readings(tmp_path / "run" / "step_000004")["sample.tokens"])
    assert snap.meta["layout"]["final_norm"] == "function:rms_norm"  # nanochat's norm(): F.rms_norm, no weights
    saved, live = (torch.tensor(entropy.run(m, ids).entropy) for m in (snap.model, model))  # [layer head]
    assert torch.allclose(saved, live, rtol=1e-5, atol=0)
    seen = []  # each block's output; then nanochat's readout by hand: backout, norm, lm_head, cut, softcap
    handles = [b.register_forward_hook(lambda mod, args, out: seen.append(out)) for b in model.transformer.h]
    with torch.no_grad():
        final = model(ids).log_softmax(-1)
        for h in handles:
            h.remove()
        read = lambda x: 15 * torch.tanh(model.lm_head(F.rms_norm(x, (64,)))[..., :VOCAB] / 15)  # noqa: E731
        by_hand = {"0_post": read(seen[0]), "3_post": read(seen[3] - model.backout_lambda * seen[2])}
    lens = logit_lens.run(snap.model, ids)
    assert lens.layers == ["embed", "0_post", "1_post", "2_post", "3_post"]
    for point, logits in by_hand.items():
        kl = (final.exp() * (final - logits.log_softmax(-1))).sum(-1).clamp_min(0).mean()
        assert math.isclose(lens.kl_to_final[lens.layers.index(point)], float(kl), rel_tol=1e-4, abs_tol=1e-6)
    assert lens.kl_to_final[-1] < 1e-6  # the lens at the last block is nanochat's own prediction
    rows = model.transformer.wte.weight.detach()[:VOCAB]  # padded to 64 rows: the vocabulary's
    found = neighbours.run(snap.model, 5, k=3, table="input").to_dict()["neighbours"]
    cos = F.cosine_similarity(rows[5:6], rows, dim=-1)
    cos[5] = -2
    assert [n["id"] for n in found] == cos.topk(3).indices.tolist()
