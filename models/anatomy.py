"""Where a module that is not ours keeps its token table, its blocks, its final norm and its
unembedding (its anatomy), found by the names of the layouts people write, so that the logit lens
and the neighbour tables read such a model through its own parts. Torch only; knows no probe.

| layout             | token table             | blocks          | final norm                    | unembedding |
|--------------------|-------------------------|-----------------|-------------------------------|-------------|
| nanoGPT            | `transformer.wte`       | `transformer.h` | `transformer.ln_f`            | `lm_head`   |
| nanochat's GPT     | `transformer.wte`       | `transformer.h` | functional RMSNorm (no weight) | `lm_head`  |
| LLMs-from-scratch  | `tok_emb`               | `trf_blocks`    | `final_norm`                  | `out_head`  |
| the video tutorial | `token_embedding_table` | `blocks`        | `ln_f`                        | `lm_head`   |

nanochat's readout holds three more things, each taken as its forward does: the logits cut to
`config.vocab_size` (its tables are padded to a multiple of 64 rows), a softcap `15 tanh(z / 15)`,
and, where the model has `backout_lambda`, the residual of block `n_layer // 2` times that lambda
taken off before the final norm. `Anatomy.residuals` hands back the residual stream as this
readout sees it, so `decode` of the last one is the model's own logits (the lens checks that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from models.layout import layout_of
from models.stream import StreamReader
from models.tap_inputs import context_of

__all__ = ["Anatomy", "AnatomyError", "find_anatomy"]

NANOCHAT_SOFTCAP = 15.0  # nanochat's forward: logits = 15 * tanh(logits / 15)


class AnatomyError(ValueError):
    """The model has none of the layouts below: one line naming it."""


@dataclass(frozen=True)
class Layout:
    name: str
    embedding: str
    blocks: str
    final_norm: str | None  # None: nanochat's functional RMSNorm
    unembedding: str


LAYOUTS = (Layout("nanoGPT", "transformer.wte", "transformer.h", "transformer.ln_f", "lm_head"),
           Layout("nanochat", "transformer.wte", "transformer.h", None, "lm_head"),
           Layout("LLMs-from-scratch", "tok_emb", "trf_blocks", "final_norm", "out_head"),
           Layout("video tutorial", "token_embedding_table", "blocks", "ln_f", "lm_head"))
KNOWN = "nanochat's GPT, nanoGPT, LLMs-from-scratch's GPTModel, the video tutorial's GPT"


def no_norm(x: torch.Tensor) -> torch.Tensor:
    """The readout of a model with no final norm: the unembedding reads the stream itself."""
    return x


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """nanochat's final norm: RMSNorm over the last axis with no weight (torch's default eps)."""
    return F.rms_norm(x, (x.size(-1),))


@dataclass(frozen=True)
class Anatomy:
    layout: str
    embedding: torch.nn.Embedding
    blocks: tuple[torch.nn.Module, ...]
    final_norm: Callable[[torch.Tensor], torch.Tensor]
    unembedding: torch.nn.Linear
    d_vocab: int  # columns of the logits the model returns
    n_ctx: int | None
    softcap: float | None = None
    backout: tuple[int, torch.Tensor] | None = None  # (block index, lambda) nanochat takes off

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def input_table(self) -> torch.Tensor:
        """The token embedding, one row per token of the logits' vocabulary: [d_vocab d_model]."""
        return self.embedding.weight.detach()[: self.d_vocab]

    def output_table(self) -> torch.Tensor:
        """The unembedding, one row per token: [d_vocab d_model]."""
        return self.unembedding.weight.detach()[: self.d_vocab]

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of residual vectors, as the model reads out its last one: [... d_model] -> [... d_vocab]."""
        x = self.final_norm(x)  # recomputed on x
        weight = self.unembedding.weight
        logits = F.linear(x, weight.to(x.dtype), None if self.unembedding.bias is None
                          else self.unembedding.bias.to(x.dtype))[..., : self.d_vocab]
        if self.softcap is None:
            return logits
        logits = logits.float()
        return self.softcap * torch.tanh(logits / self.softcap)

    def residuals(self, model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One forward on [batch pos] tokens: (the model's logits [batch pos d_vocab], the residual
        stream entering block 0 and after each block [batch pos d_model], as the readout sees it; a
        block that returns only what its parent adds reads right too: `models.stream`)."""
        end = self.final_norm if isinstance(self.final_norm, torch.nn.Module) else \
            self.unembedding if self.final_norm is no_norm else None  # what reads the last block's stream
        with StreamReader(self.blocks, end) as reader:
            logits = logits_of(model(tokens))
        resid = reader.residuals()
        if self.backout is not None:  # nanochat: x - lambda * x_backout from that block on
            layer, lam = self.backout
            taken = resid[layer + 1]
            resid = resid[: layer + 1] + [r - lam.to(r.dtype) * taken for r in resid[layer + 1:]]
        return logits, resid


def logits_of(output: Any) -> torch.Tensor:
    """The logits a forward returned: a tensor, the first of a (logits, loss) tuple, or `.logits`."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise AnatomyError(f"the model returned a {type(output).__name__}, not logits")


def find_anatomy(model: Any) -> Anatomy:
    """The anatomy of `model` by the first layout of LAYOUTS whose modules it has, else by the parts one
    forward of it shows (`models.layout`: any names, a Llama's too); AnatomyError (one line) where
    neither finds them."""
    modules = dict(model.named_modules()) if isinstance(model, torch.nn.Module) else {}
    for layout in LAYOUTS:
        found = _match(model, modules, layout)
        if found is not None:
            return found
    known = (f"{type(model).__name__} has none of the layouts whose token table, blocks, final norm and "
             f"unembedding are known here ({KNOWN})")
    if not isinstance(model, torch.nn.Module) or hasattr(getattr(model, "cfg", None), "n_ctx"):
        raise AnatomyError(known)  # ours and a bridge: their hook points and W_U say what they have
    try:
        found = anatomy_of(model)
    except Exception as err:  # noqa: BLE001 - the model's own forward: said in one line
        raise AnatomyError(f"{known}, and its forward on two tokens failed ({type(err).__name__}: "
                           f"{(str(err).strip().splitlines() or [''])[0]})") from None
    if found is None:
        layout = layout_of(model)
        part = next(p for p in ("blocks", "unembedding", "final_norm", "token_embedding") if not getattr(layout, p))
        raise AnatomyError(f"{known}, nor does its forward show them: {layout.why_missing(part)}")
    return found


def _match(model: Any, modules: dict[str, torch.nn.Module], layout: Layout) -> Anatomy | None:
    embedding, blocks = modules.get(layout.embedding), modules.get(layout.blocks)
    head = modules.get(layout.unembedding)
    if not (isinstance(embedding, torch.nn.Embedding) and isinstance(head, torch.nn.Linear)
            and isinstance(blocks, (torch.nn.ModuleList, torch.nn.Sequential)) and len(blocks)):
        return None
    if layout.final_norm is None:  # nanochat: no norm module where nanoGPT keeps its ln_f
        if "transformer.ln_f" in modules:
            return None
        norm: Callable[[torch.Tensor], torch.Tensor] = rms_norm
    else:
        if layout.final_norm not in modules:
            return None
        norm = modules[layout.final_norm]
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    d_vocab = vocab if isinstance(vocab, int) and 0 < vocab <= head.out_features else head.out_features
    nanochat = layout.name == "nanochat"
    softcap = float(getattr(model, "softcap", NANOCHAT_SOFTCAP)) if nanochat else None
    lam = getattr(model, "backout_lambda", None)
    backout = (len(blocks) // 2, lam.detach()) if nanochat and isinstance(lam, torch.Tensor) else None
    return Anatomy(layout.name, embedding, tuple(blocks), norm, head, d_vocab, context_of(model), softcap, backout)


def anatomy_of(model: torch.nn.Module) -> Anatomy | None:
    """The anatomy from the layout its forward shows (`models.layout.layout_of`), for a model of
    none of LAYOUTS; None where a part the lens needs is missing."""
    layout = layout_of(model)
    if not (layout.token_embedding and layout.blocks and layout.unembedding and layout.final_norm):
        return None
    embedding = model.get_submodule(layout.token_embedding.rsplit(".", 1)[0])
    head = model.get_submodule(layout.unembedding)
    norms = {"none": no_norm, "function:rms_norm": rms_norm,
             "function:layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],))}
    norm = norms.get(layout.final_norm) or model.get_submodule(layout.final_norm)
    return Anatomy("found by its forward", embedding, tuple(model.get_submodule(b) for b in layout.blocks), norm,
                   head, layout.d_vocab or head.out_features, context_of(model))
