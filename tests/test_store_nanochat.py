"""--ckpt on nanochat's checkpoints: ``base_checkpoints/dN/model_NNNNNN.pt`` + ``meta_NNNNNN.json``,
written here in our own words with the names and meta keys nanochat's save_checkpoint writes.
Built with nanochat's own GPT where the ``nanochat`` package imports (those tests skip otherwise);
without it, one line saying what to install."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from models.checkpoint import CheckpointError, load_checkpoint

DEPTH, HEADS, KV_HEADS, WIDTH, CONTEXT, VOCAB = 2, 4, 2, 32, 16, 100


def nanochat_state(seed: int, vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    """Every tensor nanochat's GPT saves, by its names and shapes: value embeddings (and their gate)
    on the layers whose parity matches the last layer's; tables padded to a multiple of 64 rows."""
    gen = torch.Generator().manual_seed(seed)
    d_head = WIDTH // HEADS
    kv = KV_HEADS * d_head
    padded = -(-vocab // 64) * 64
    shapes = {"resid_lambdas": (DEPTH,), "x0_lambdas": (DEPTH,), "smear_lambda": (1,), "backout_lambda": (1,),
              "transformer.wte.weight": (padded, WIDTH), "lm_head.weight": (padded, WIDTH),
              "smear_gate.weight": (1, 24)}
    for i in range(DEPTH):
        block = f"transformer.h.{i}"
        shapes.update({f"{block}.attn.c_q.weight": (WIDTH, WIDTH), f"{block}.attn.c_k.weight": (kv, WIDTH),
                       f"{block}.attn.c_v.weight": (kv, WIDTH), f"{block}.attn.c_proj.weight": (WIDTH, WIDTH),
                       f"{block}.mlp.c_fc.weight": (4 * WIDTH, WIDTH),
                       f"{block}.mlp.c_proj.weight": (WIDTH, 4 * WIDTH)})
        if i % 2 == (DEPTH - 1) % 2:
            shapes[f"{block}.attn.ve_gate.weight"] = (KV_HEADS, 12)
            shapes[f"value_embeds.{i}.weight"] = (padded, kv)
    return {name: 0.3 * torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def write_nanochat(base: Path, steps=(10, 20), *, bf16_compiled: bool = False, vocab: int = VOCAB) -> Path:
    """``base/base_checkpoints/d2`` holding one model and meta file per step; returns the folder."""
    folder = base / "base_checkpoints" / f"d{DEPTH}"
    folder.mkdir(parents=True)
    for step in steps:
        state = nanochat_state(step, vocab)
        if bf16_compiled:  # a torch.compile'd model trained in bfloat16
            state = {f"_orig_mod.{k}": v.bfloat16() for k, v in state.items()}
        torch.save(state, folder / f"model_{step:06d}.pt")
        meta = {"step": step, "val_bpb": 1.5, "user_config": {"depth": DEPTH},
                "model_config": {"sequence_len": CONTEXT, "vocab_size": vocab, "n_layer": DEPTH, "n_head": HEADS,
                                 "n_kv_head": KV_HEADS, "n_embd": WIDTH, "window_pattern": "SL"}}
        (folder / f"meta_{step:06d}.json").write_text(json.dumps(meta))
    return folder


def nanochat_importable() -> bool:
    try:
        import nanochat.gpt  # noqa: F401  (its GPT is what the loader builds)
    except ImportError:
        return False
    return True


needs_nanochat = pytest.mark.skipif(not nanochat_importable(), reason="the nanochat package does not import")


@pytest.fixture
def hidden(monkeypatch):
    """nanochat made unimportable, whether or not it is installed."""
    for name in [m for m in sys.modules if m == "nanochat" or m.startswith("nanochat.")] + ["nanochat"]:
        monkeypatch.setitem(sys.modules, name, None)


def test_without_nanochat_one_line_says_what_to_install(tmp_path, hidden, capsys):
    from probes import entropy

    folder = write_nanochat(tmp_path)
    with pytest.raises(CheckpointError, match=r"model_000020\.pt: a nanochat checkpoint is built with "
                                              r"nanochat's own GPT.*pip install -e PATH/TO/nanochat"):
        load_checkpoint(folder)  # dN: its latest step
    assert entropy.main(["--ckpt", str(folder / "model_000010.pt"), "--text", "ab"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "model_000010.pt: a nanochat checkpoint" in error and "series" not in error


def test_peek_reads_the_meta_file_and_counts_the_weights(tmp_path):
    from models.store.peek import peek

    folder = write_nanochat(tmp_path)
    held = peek(folder / "model_000010.pt")
    assert held["format"] == "nanochat checkpoint" and held["step"] == 10
    assert held["model"] | {"n_params": None} == {
        "architecture": "nanochat", "n_layers": DEPTH, "n_heads": HEADS, "n_kv_heads": KV_HEADS, "d_model": WIDTH,
        "n_ctx": CONTEXT, "d_vocab": VOCAB, "n_params": None, "unembed": "separate", "family": "transformer"}
    assert held["model"]["n_params"] == sum(v.numel() for v in nanochat_state(10).values())


def test_a_meta_file_without_its_config_is_one_line_naming_it(tmp_path):
    folder = write_nanochat(tmp_path, steps=(5,))
    (folder / "meta_000005.json").write_text(json.dumps({"step": 5}))
    with pytest.raises(CheckpointError, match=r"meta_000005\.json: no 'model_config'"):
        load_checkpoint(folder / "model_000005.pt")


def test_a_model_file_without_its_meta_file_names_the_missing_meta_file(tmp_path, capsys):
    from models import info

    folder = write_nanochat(tmp_path, steps=(5,))
    (folder / "meta_000005.json").unlink()
    with pytest.raises(CheckpointError, match=r"model_000005\.pt: nanochat's meta file meta_000005\.json is missing"):
        load_checkpoint(folder / "model_000005.pt")
    assert info.main(["--ckpt", str(folder / "model_000005.pt")]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "meta_000005.json is missing" in error


def test_the_file_names_step_wins_over_a_meta_file_that_disagrees(tmp_path, caplog):
    from models.store.peek import peek

    folder = write_nanochat(tmp_path, steps=(20,))
    meta = json.loads((folder / "meta_000020.json").read_text())
    (folder / "meta_000020.json").write_text(json.dumps({**meta, "step": 999}))
    with caplog.at_level(logging.WARNING):
        assert peek(folder / "model_000020.pt")["step"] == 20
    said = [r.getMessage() for r in caplog.records if "999" in r.getMessage()]
    assert len(said) == 1 and "model_000020.pt's name, step 20, is taken" in said[0]


@needs_nanochat
def test_built_by_nanochat_with_the_written_weights(tmp_path, caplog):
    folder = write_nanochat(tmp_path)
    with caplog.at_level(logging.WARNING):
        snap = load_checkpoint(folder)
    assert type(snap.model).__module__ == "nanochat.gpt" and not snap.model.training
    assert snap.step == 20 and snap.name == f"d{DEPTH}/model_000020.pt" and snap.tokenizer is None
    assert (snap.config.n_layers, snap.config.n_kv_heads, snap.config.n_ctx) == (DEPTH, KV_HEADS, CONTEXT)
    assert {k: v for k, v in snap.model.state_dict().items()}.keys() == nanochat_state(20).keys()
    for name, tensor in nanochat_state(20).items():
        assert torch.equal(snap.model.state_dict()[name], tensor), name
    logits = snap.model(torch.tensor([[1, 2, 3, 99]]))
    assert logits.shape == (1, 4, VOCAB) and bool(torch.isfinite(logits).all())
    assert sum("token ids only" in r.getMessage() for r in caplog.records) == 1


@needs_nanochat
def test_bf16_and_compiled_names_load_as_nanochat_loads_them(tmp_path):
    folder = write_nanochat(tmp_path, steps=(7,), bf16_compiled=True)
    snap = load_checkpoint(folder / "model_000007.pt", device="cpu")
    wte = snap.model.state_dict()["transformer.wte.weight"]
    written = nanochat_state(7)["transformer.wte.weight"]
    assert wte.dtype == torch.float32 and torch.equal(wte, written.bfloat16().float())


def test_the_unembedding_probes_say_in_one_line_why_not_on_a_module_without_hook_points():
    from probes import attribution, logit_lens
    from probes.errors import ProbeInputError

    class Bigram(torch.nn.Module):  # ids -> logits, as nanochat's GPT maps them, with no hook points
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(VOCAB, VOCAB)

        def forward(self, idx):
            return self.table(idx)

    tokens = torch.tensor([[1, 2, 3]])
    with pytest.raises(ProbeInputError, match=r"^Bigram has no hook points on its residual stream .*nor does its forward "
                                              r"show them: no ModuleList or Sequential of blocks .*the lenses cannot"):
        logit_lens.run(Bigram(), tokens)
    with pytest.raises(ProbeInputError, match=r"^Bigram has no hook points on its heads and MLPs"):
        attribution.run(Bigram(), tokens, position=-1)


def test_base_checkpoints_itself_names_the_models_to_choose_from(tmp_path):
    folder = write_nanochat(tmp_path, steps=(5,))
    with pytest.raises(CheckpointError, match=rf"a folder of nanochat models \(d{DEPTH}\): give one of them"):
        load_checkpoint(folder.parent)


@needs_nanochat
def test_models_info_lists_the_attention_calls_the_tap_reads(tmp_path, capsys):
    from models import info

    folder = write_nanochat(tmp_path, steps=(4,))
    assert info.main(["--ckpt", str(folder), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["n_params"] == sum(v.numel() for v in nanochat_state(4).values()) and got["step"] == 4
    assert got["attention_calls"] == {f"transformer.h.{i}.attn": {"pattern": [1, HEADS, 8, 8], "kind": "sdpa"}
                                      for i in range(DEPTH)}


@needs_nanochat
def test_a_truncated_model_file_is_said_to_be_truncated(tmp_path, capsys):
    from probes import entropy

    folder = write_nanochat(tmp_path, steps=(6,))
    data = (folder / "model_000006.pt").read_bytes()
    (folder / "model_000006.pt").write_bytes(data[: len(data) // 2])
    assert entropy.main(["--ckpt", str(folder), "--text", "ab"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "model_000006.pt: cannot load" in error and "truncated or damaged" in error
    assert "Errno" not in error.split("truncated")[0]


@needs_nanochat
def test_weights_that_do_not_fit_the_gpt_are_named_in_one_line(tmp_path):
    folder = write_nanochat(tmp_path, steps=(8,))
    state = nanochat_state(8)
    del state["transformer.h.1.mlp.c_fc.weight"]
    state["transformer.h.9.attn.c_q.weight"] = torch.zeros(WIDTH, WIDTH)
    state["lm_head.weight"] = torch.zeros(64, WIDTH)
    torch.save(state, folder / "model_000008.pt")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(folder)
    message = str(caught.value)
    assert "\n" not in message and "Error(s) in loading" not in message
    assert message.startswith(f"{folder / 'model_000008.pt'}: its weights do not fit the GPT its meta file describes: "
                              "missing transformer.h.1.mlp.c_fc.weight (1); unexpected transformer.h.9.attn.c_q.weight "
                              "(1); shape of lm_head.weight [64, 32] (the GPT's: [128, 32]) (1)"), message


def test_a_meta_file_declaring_more_than_its_weights_is_refused_before_anything_is_built(tmp_path, hidden):
    """Refused before nanochat is even imported (hidden here): a meta file of 10,000 layers was built
    (44 s, 3.4 GB) before its weights were compared; nanochat's own assert on n_embd % n_head."""
    cases = {"n_layer": ({"n_layer": 10_000}, r"declares n_layer 10000 where the weights hold 2"),
             "n_embd": ({"n_embd": 64, "n_head": 4}, r"declares n_embd 64 where the weights hold 32"),
             "vocab_size": ({"vocab_size": 10**9}, r"declares vocab_size 1000000000 where the weights hold 128"),
             "n_embd % n_head": ({"n_embd": 30}, r"n_embd 30, n_head 4 and n_kv_head 2 do not divide"),
             "n_head % n_kv_head": ({"n_kv_head": 3}, r"n_head 4 and n_kv_head 3 do not divide"),
             "sequence_len": ({"sequence_len": 10**9}, r"sequence_len 1000000000 is past 131072")}
    for name, (change, said) in cases.items():
        folder = write_nanochat(tmp_path / name.replace(" ", "_").replace("%", "mod"), steps=(4,))
        meta = folder / "meta_000004.json"
        data = json.loads(meta.read_text())
        data["model_config"].update(change)
        meta.write_text(json.dumps(data))
        with pytest.raises(CheckpointError, match=rf"meta_000004\.json: .*{said}") as caught:
            load_checkpoint(folder)
        assert "\n" not in str(caught.value), name
