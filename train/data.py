"""Training data and evaluation for `python -m train`: one text file, encoded once, split in two.

The whole text is encoded once; the last `val_fraction` of the tokens is the validation split.
Batches are random windows ("blocks") of `block_len(cfg)` tokens:

- transformer: n_ctx + 1 tokens; inputs block[:, :-1], targets block[:, 1:] (every position);
- mlp: 2 * n_ctx tokens; the model slides its n_ctx window along the inputs and returns
  [batch n_ctx vocab], one prediction per window, whose targets are block[:, n_ctx:].

Both cases are one rule: `targets = block[:, -P:]` where P = logits.shape[1].
"""

from __future__ import annotations

import hashlib
import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.config import ModelConfig, TransformerConfig
from models.loss import block_len, lm_loss
from models.bpe import BPEVocabError
from models.tokenizers import BPETokenizer, CharTokenizer, Tokenizer
from probes.entropy import series_entropy
from train.host_copy import HostCopy

log = logging.getLogger(__name__)
MAX_DATA_BYTES = 2 * 2**30


@dataclass(frozen=True)
class Corpus:
    """A text file encoded with one tokenizer and split into train / val token ids."""

    path: Path
    sha256: str
    size_bytes: int
    tokenizer: Tokenizer
    train: torch.Tensor  # [n_train] long
    val: torch.Tensor  # [n_val] long
    chars_per_token: float  # over the val split (1.0 for a char tokenizer)

    def summary(self) -> str:
        return (f"data {self.path}: {self.size_bytes} bytes, {self.train.numel() + self.val.numel()} "
                f"tokens ({self.tokenizer.kind}, vocab {self.tokenizer.vocab_size}): "
                f"{self.train.numel()} train / {self.val.numel()} val, "
                f"{self.chars_per_token:.3f} chars/token")

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "size_bytes": self.size_bytes,
                "train_tokens": int(self.train.numel()), "val_tokens": int(self.val.numel()),
                "chars_per_token": self.chars_per_token}


def read_text(path: Path) -> tuple[str, bytes]:
    """The file's text and raw bytes; ValueError naming the problem."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_DATA_BYTES + 1)  # a device like /dev/zero never ends
        if len(raw) > MAX_DATA_BYTES:
            raise ValueError(f"data file {path} is larger than {MAX_DATA_BYTES // 2**30} GB; this "
                             "trainer encodes the whole file in memory: cut it")
    except FileNotFoundError:
        raise ValueError(f"data file {path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"data file {path} is a directory, not a text file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"data file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text:
        raise ValueError(f"data file {path} is empty")
    return text, raw


def build_tokenizer(kind: str, path: Path, text: str, bpe_vocab: int) -> Tokenizer:
    """A char tokenizer of the text's characters, or SentencePiece BPE trained on the file."""
    if kind == "char":
        return CharTokenizer.from_text(text)
    if kind == "bpe":
        try:
            return BPETokenizer.train(path, bpe_vocab)
        except BPEVocabError as err:  # in this CLI's words: the flag to change, and to what
            bound = f"{err.low} or more" if err.low is not None else f"{err.high} or less"
            raise ValueError(f"{err}: pass --bpe-vocab {bound}") from None
    raise ValueError(f"unknown tokenizer kind {kind!r}; use char or bpe")


def load_corpus(path: Path, tokenizer_kind: str, val_fraction: float, *, bpe_vocab: int = 2048,
                tokenizer: Tokenizer | None = None) -> Corpus:
    """Read, hash, tokenize (with `tokenizer` if given, e.g. a resumed run's) and split."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    text, raw = read_text(path)
    tokenizer = tokenizer or build_tokenizer(tokenizer_kind, path, text, bpe_vocab)
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)  # [n_tokens]
    n_val = int(round(len(ids) * val_fraction))
    train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val:]
    val_chars = len(tokenizer.decode(val.tolist())) if n_val else len(text)
    chars_per_token = 1.0 if tokenizer.kind == "char" else val_chars / max(1, n_val or len(ids))
    return Corpus(Path(path), hashlib.sha256(raw).hexdigest(), len(raw), tokenizer, train, val,
                  chars_per_token)


def predictions_per_block(cfg: ModelConfig) -> int:
    """Loss terms (target tokens) per block: what `tokens` in metrics.jsonl counts."""
    return cfg.n_ctx


def check_length(corpus: Corpus, cfg: ModelConfig) -> None:
    need = block_len(cfg)
    splits = [("train", corpus.train)] + ([("val", corpus.val)] if corpus.val.numel() else [])
    for name, ids in splits:
        if ids.numel() < need:
            raise ValueError(
                f"the {name} split of {corpus.path} has {ids.numel()} tokens, fewer than one "
                f"context window of {need} (n_ctx={cfg.n_ctx}); use a longer text or a smaller "
                f"--val-fraction")


def sample_blocks(ids: torch.Tensor, batch_size: int, length: int,
                  generator: torch.Generator) -> torch.Tensor:
    """`batch_size` random windows of `length` consecutive ids: [batch length]."""
    starts = torch.randint(0, ids.numel() - length + 1, (batch_size,), generator=generator)
    offsets = torch.arange(length)
    return ids[starts[:, None] + offsets[None, :]]


# The run doctor's numbers (attn_logit_max, resid_rms, logit_max) ride on the eval forward that
# already measures attention entropy; False skips them (benchmarks price them this way).
DOCTOR_METRICS = True


def _layer(hook: Any) -> str:
    return hook.name.split(".")[1]  # "blocks.3.attn.hook_pattern" -> "3"


def eval_batch_stats(model: Any, block: torch.Tensor, doctor: bool = True) -> dict[str, Any]:
    """One hooked forward on the inputs of `block` [batch length], each hook reducing its
    activation at once (memory stays at one layer's worth); non-finite values stay NaN / inf
    (metrics.jsonl writes them as null). Keys (transformers; the MLP family has `logit_max` only):

    - attn_entropy {"layer": [per-head series entropy, nats]}: `probes.entropy.series_entropy`,
      -(p * (p + 1e-10).log()).sum(-1) averaged over the batch and all query rows (row 0
      included), as the series logged it;
    - attn_logit_max {"layer": [per head the largest pre-softmax score over the batch and the
      visible (causal) query/key pairs]}: attention-logit growth (Wortsman et al. 2023);
    - resid_rms {"layer": sqrt(mean(x^2)) of blocks.{l}.hook_resid_post over batch, pos, d_model};
    - logit_max: the largest |logit| of the model's output on the batch.

    `doctor=False` computes attn_entropy only (the eval record as it was before the others).
    """
    return forward_stats(model, block[:, :-1], doctor)


def forward_stats(model: Any, inputs: torch.Tensor, doctor: bool = True) -> dict[str, Any]:
    """`eval_batch_stats` on `inputs` [batch pos] themselves (the Monitor's eval tokens)."""
    return HostCopy(forward_readings(model, inputs, doctor), finish_forward_stats).get()


@torch.no_grad()
def attention_entropy(model: Any, inputs: torch.Tensor, autocast: Any = nullcontext) -> dict[str, list[float]]:
    """Each head's series entropy on `inputs` [batch pos], read on the host ({layer: [head]}; {} for
    a model without heads), the model in eval mode meanwhile: the guard's collapse readings.
    `autocast`: a context manager factory (the trainer's bf16 autocast)."""
    was_training = model.training
    model.eval()
    try:
        with autocast():
            return forward_stats(model, inputs, doctor=False).get("attn_entropy") or {}
    finally:
        model.train(was_training)


def forward_readings(model: Any, inputs: torch.Tensor, doctor: bool = True) -> dict[str, Any]:
    """`forward_stats` still on the device: {"attn_entropy": {layer: [head] tensor}, ...,
    "logit_max": 0-d tensor}; `finish_forward_stats` ends it once read on the host."""
    if not isinstance(model.cfg, TransformerConfig):
        return {"logit_max": model(inputs).abs().amax().float()} if doctor else {}
    entropy: dict[str, torch.Tensor] = {}
    score_max: dict[str, torch.Tensor] = {}
    rms: dict[str, torch.Tensor] = {}

    def on_pattern(pattern: torch.Tensor, hook: Any) -> None:  # pattern [batch head q k]
        entropy[_layer(hook)] = series_entropy(pattern.float())  # [head]

    def on_scores(scores: torch.Tensor, hook: Any) -> None:  # [batch head q k], -inf where masked
        score_max[_layer(hook)] = scores.amax(dim=(0, 2, 3)).float()  # [head]; max is exact in bf16

    def on_resid(resid: torch.Tensor, hook: Any) -> None:  # [batch pos d_model]
        rms[_layer(hook)] = resid.float().square().mean().sqrt()  # []

    hooks = [(lambda n: n.endswith("attn.hook_pattern"), on_pattern)]
    if doctor:
        hooks += [(lambda n: n.endswith("attn.hook_attn_scores"), on_scores),
                  (lambda n: n.startswith("blocks.") and n.endswith(".hook_resid_post"), on_resid)]
    logits = model.run_with_hooks(inputs, fwd_hooks=hooks)  # [batch pos d_vocab]
    if not doctor:
        return {"attn_entropy": entropy}
    return {"attn_entropy": entropy, "attn_logit_max": score_max, "resid_rms": rms,
            "logit_max": logits.abs().amax().float()}


def finish_forward_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """`forward_readings` read on the host: each entropy rounded to 6 digits, as the series logged it."""
    if "attn_entropy" in stats:
        stats["attn_entropy"] = {layer: [round(h, 6) for h in heads] for layer, heads in stats["attn_entropy"].items()}
    return stats


@torch.no_grad()
def evaluate(model: Any, blocks: torch.Tensor, batch_size: int, chars_per_token: float,
             autocast: Any) -> dict[str, Any]:
    """val_loss / val_ppl / bpc over fixed val `blocks` [n length]. (The model's internals at an
    eval step are the Monitor's: `train.monitor.parts.internal_stats` on the first batch.)

    bpc = log2(ppl) / chars_per_token (bits per token over characters per token).
    """
    was_training = model.training
    model.eval()
    try:
        total, count = 0.0, 0
        with autocast():
            for chunk in torch.split(blocks, batch_size):
                total += float(lm_loss(model, chunk)) * chunk.shape[0]
                count += chunk.shape[0]
    finally:
        model.train(was_training)
    val_loss = total / count  # nats per token
    ppl = math.inf if val_loss > 709 else math.exp(val_loss)
    bpc = val_loss / math.log(2) / chars_per_token  # = log2(ppl) / chars_per_token
    return {"val_loss": val_loss, "val_ppl": ppl, "bpc": bpc}
