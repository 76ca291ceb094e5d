"""The `mlp` family: the series' first language model.

n_ctx token embeddings are concatenated and fed to a plain MLP that predicts the next token.
Given [batch pos] tokens with pos >= n_ctx, it slides the window along and returns logits for
every full window: [batch pos-n_ctx+1 d_vocab] (the series' [batch n_ctx] input gives one window).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from models.cache import CacheMixin
from models.config import MLPConfig
from models.layers import MLP, shrink_
from models.validation import check_tokens


class MLPLanguageModel(CacheMixin, HookedRootModule):
    def __init__(self, cfg: MLPConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.d_vocab, cfg.d_embed)
        self.mlp = MLP(cfg.d_input, cfg.d_hidden, cfg.d_vocab, cfg.n_hidden_layers, cfg.act_fn)
        self.hook_embed = HookPoint()  # [batch pos d_embed]
        self.hook_window = HookPoint()  # [batch window n_ctx*d_embed], the MLP's input
        if cfg.unembed_init_scale != 1.0:  # logits that many times smaller at init
            shrink_(self.mlp.net[-1].weight, self.mlp.net[-1].bias, cfg.unembed_init_scale)
        self.setup()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = check_tokens(tokens, self.cfg.d_vocab, min_len=self.cfg.n_ctx)  # [batch pos]
        x = self.hook_embed(self.embedding(tokens))  # [batch pos d_embed]
        windows = x.unfold(1, self.cfg.n_ctx, 1)  # [batch window d_embed n_ctx]
        windows = windows.transpose(2, 3).flatten(2)  # [batch window n_ctx*d_embed]
        windows = self.hook_window(F.dropout(windows, self.cfg.dropout, self.training))
        return self.mlp(windows)  # [batch window d_vocab]
