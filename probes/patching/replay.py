"""Exact patching on our Transformer, fast: patched runs resume from the patched layer's cached
activations (the layers below are not run again) and run only the positions from the earliest
patched one on, reading the earlier positions' keys and values from the base run's cache (in a
causal model nothing before a patched position can change).

The blocks' own modules (norms, q/k/v projection, output projection, MLP) do the arithmetic; only
the causal attention over cached plus new keys is written here. The base run is replayed through
the same code and checked against the model's own logits before any patch is trusted
(`ReplayEngine.trace`): a model this replica does not reproduce falls back to the hooked engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from probes.patching.cells import write_patch


@dataclass
class Trace:
    """One run's activations per layer, each [batch pos ...]."""
    resid: list[torch.Tensor]  # resid_pre [batch pos d_model]
    k: list[torch.Tensor]  # [batch pos head d_head] (after a q/k norm)
    v: list[torch.Tensor]
    z: list[torch.Tensor]  # [batch pos head d_head]
    attn_out: list[torch.Tensor]  # [batch pos d_model]
    mid: list[torch.Tensor]  # resid_mid
    mlp_out: list[torch.Tensor]
    post: list[torch.Tensor]  # resid_post
    logits: torch.Tensor  # [batch pos vocab]

    def act(self, what: str, layer: int) -> torch.Tensor:
        return {"heads": self.z, "resid": self.resid, "attn": self.attn_out, "mlp": self.mlp_out}[what][layer]


def project(attn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (after a q/k norm) and v of x [... pos d_model]: each [... pos head d_head]."""
    W, b, _ = attn.qkv_weights(model_guard=True)
    q, k, v = attn.project_qkv(x, W, b).unbind(dim=-3)
    if "q_norm" in attn._modules:
        q, k = attn.q_norm(q, True), attn.k_norm(k, True)
    return q, k, v


def attend(attn, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, last: bool = False):
    """Causal attention of x [rows m d_model] (positions s.. s+m-1) over the cached keys and values
    of positions 0..s-1 [rows s head d_head] and its own: (z, k, v), each [rows m head d_head];
    with `last`, z of the last position alone [rows 1 head d_head] (the others are only keys)."""
    q, k, v = project(attn, x)  # each [rows m head d_head]
    s, m = past_k.shape[1], x.shape[1]
    keys = torch.cat([past_k, k], 1).transpose(1, 2) if s else k.transpose(1, 2)  # [rows head s+m d_head]
    values = torch.cat([past_v, v], 1).transpose(1, 2) if s else v.transpose(1, 2)
    if last:  # the last query sees every key
        z = F.scaled_dot_product_attention(q[:, -1:].transpose(1, 2), keys, values, scale=1.0 / attn.scale)
    elif s:  # query i (position s+i) sees keys 0..s+i
        mask = torch.arange(s, s + m, device=x.device)[:, None] >= torch.arange(s + m, device=x.device)  # [m s+m]
        z = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, scale=1.0 / attn.scale)
    else:
        z = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True, scale=1.0 / attn.scale)
    return z.transpose(1, 2), k, v  # z: [rows m|1 head d_head]


def mid_of(block, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    """resid_mid from resid_pre and the attention's output."""
    return block.norm(1, x + attn_out if block.cfg.residual else attn_out, "post", True)


def post_of(block, mid: torch.Tensor, mlp_out: torch.Tensor) -> torch.Tensor:
    """resid_post from resid_mid and the MLP's output."""
    return block.norm(2, mid + mlp_out if block.cfg.residual else mlp_out, "post", True)


def mlp_of(block, mid: torch.Tensor) -> torch.Tensor:
    return block.mlp(block.norm(2, mid, "pre", True), True)


class ReplayEngine:
    """Patches our Transformer's activations from cached layers on (see the module's docstring)."""
    suffix = True  # runs only positions from the earliest patched one on

    def __init__(self, model):
        self.model = model
        self.blocks = list(model.blocks)

    def trace(self, tokens: torch.Tensor) -> Trace:
        t = Trace([], [], [], [], [], [], [], [], None)
        x = self.model.embed(tokens, True)
        empty = x.new_zeros(x.shape[0], 0, 1, 1)
        for block in self.blocks:
            attn = block.attention
            t.resid.append(x)
            z, k, v = attend(attn, block.norm(1, x, "pre", True), empty, empty)
            t.k.append(k), t.v.append(v), t.z.append(z)
            t.attn_out.append(attn.output(z))
            t.mid.append(mid_of(block, x, t.attn_out[-1]))
            t.mlp_out.append(mlp_of(block, t.mid[-1]))
            x = post_of(block, t.mid[-1], t.mlp_out[-1])
            t.post.append(x)
        t.logits = self.model.unembed(x, True)
        return t

    def patched(self, base: Trace, donor: Trace, what: str, layer: int, cells: list, start: int,
                last_only: bool) -> torch.Tensor:
        """Logits of len(cells) patched runs, patch-major: [cells*batch pos-start|1 vocab]."""
        n = len(cells)
        rows = lambda t: t[:, start:].repeat(n, *([1] * (t.dim() - 1)))  # [n*batch pos-start ...]
        block = self.blocks[layer]
        if what == "resid":  # a key of this layer's attention changes: the block runs again
            x = self.resume(base, layer, write_patch(rows(base.resid[layer]), donor.resid[layer], cells, start),
                            start, n, last_only)
        elif cells[0][0] is not None:  # one position's output changes: this block runs at it alone
            post = rows(base.post[layer])  # [rows pos-start d_model]
            where, post_at = self.one_position(base, donor, what, layer, cells)
            post[torch.arange(post.shape[0]), where - start] = post_at
            x = self.resume(base, layer + 1, post, start, n, last_only)
        else:
            if what == "mlp":
                post = post_of(block, rows(base.mid[layer]),
                               write_patch(rows(base.mlp_out[layer]), donor.mlp_out[layer], cells, start))
            else:
                if what == "heads":
                    attn_out = block.attention.output(write_patch(rows(base.z[layer]), donor.z[layer], cells, start))
                else:
                    attn_out = write_patch(rows(base.attn_out[layer]), donor.attn_out[layer], cells, start)
                mid = mid_of(block, rows(base.resid[layer]), attn_out)
                post = post_of(block, mid, mlp_of(block, mid))
            x = self.resume(base, layer + 1, post, start, n, last_only)
        if last_only:
            return self.model.unembed(x[:, -1:], True)  # [rows 1 vocab]
        logits = self.model.unembed(x, True)
        if start:
            logits = torch.cat([base.logits[:, :start].repeat(n, 1, 1), logits], 1)
        return logits

    def one_position(self, base: Trace, donor: Trace, what: str, layer: int, cells: list):
        """Each patched run's position [rows] and its resid_post there [rows d_model], when its cell
        patches a head, the attention or the MLP of `layer` at one position: nothing else of the
        block changes (the attention's keys and values are upstream of the patch)."""
        batch = base.resid[0].shape[0]
        where = torch.tensor([p for p, _ in cells], device=base.logits.device).repeat_interleave(batch)  # [rows]
        b = torch.arange(batch, device=where.device).repeat(len(cells))  # [rows]
        at = lambda acts: acts[layer][b, where].unsqueeze(1)  # [rows 1 ...]
        block = self.blocks[layer]
        if what == "mlp":
            return where, post_of(block, at(base.mid), at(donor.mlp_out))[:, 0]
        if what == "heads":
            heads = torch.tensor([h for _, h in cells], device=where.device).repeat_interleave(batch)  # [rows]
            z = at(base.z).clone()  # [rows 1 head d_head]
            z[torch.arange(len(heads)), 0, heads] = at(donor.z)[torch.arange(len(heads)), 0, heads]
            attn_out = block.attention.output(z)
        else:
            attn_out = at(donor.attn_out)
        mid = mid_of(block, at(base.resid), attn_out)
        return where, post_of(block, mid, mlp_of(block, mid))[:, 0]

    def resume(self, base: Trace, layer: int, x: torch.Tensor, start: int, n: int, last_only: bool) -> torch.Tensor:
        """The residual after the last block [rows m|1 d_model], from resid_pre of `layer` at positions
        start..; with `last_only`, the last block runs its queries and MLP at the last position alone."""
        for l in range(layer, len(self.blocks)):
            block = self.blocks[l]
            last = last_only and l == len(self.blocks) - 1
            past = [c[l][:, :start].repeat(n, 1, 1, 1) for c in (base.k, base.v)]
            z, _, _ = attend(block.attention, block.norm(1, x, "pre", True), *past, last=last)
            x = x[:, -1:] if last else x
            mid = mid_of(block, x, block.attention.output(z))
            x = post_of(block, mid, mlp_of(block, mid))
        return x
