"""The fixes name a setting the user can change: `python -m train`'s flag for our runs, the same
setting in nanoGPT's train.py or the Hugging Face Trainer's TrainingArguments for theirs, and
plain words where the trainer is unknown (TensorBoard events say nothing of who wrote them)."""

from __future__ import annotations

__all__ = ["OURS", "TRAINERS", "flag"]

OURS = "scratchscope"
TRAINERS = (OURS, "nanogpt", "hf", "unknown")

# our flag -> {trainer: its setting}; "unknown" is the words used when the trainer is not known
SETTINGS: dict[str, dict[str, str]] = {
    "--grad-clip 1.0": {"nanogpt": "--grad_clip=1.0", "hf": "max_grad_norm=1.0",
                        "unknown": "torch.nn.utils.clip_grad_norm_(params, 1.0)"},
    "--save-every": {"nanogpt": "--always_save_checkpoint=True", "hf": "save_steps",
                     "unknown": "save checkpoints more often"},
    "--set dropout=0.2": {"nanogpt": "--dropout=0.2", "hf": "the model config's dropout",
                          "unknown": "dropout"},
    "--set qk_norm=rms": {"nanogpt": "RMSNorm on q and k per head in CausalSelfAttention, before q @ k",
                          "hf": "a model whose attention normalises q and k (qk_layernorm)",
                          "unknown": "RMSNorm on q and k per head before the dot product"},
    "--z-loss 1e-4": {"nanogpt": "loss = loss + 1e-4 * logits.logsumexp(-1).pow(2).mean()",
                      "hf": "1e-4 * logsumexp(logits)^2 added in compute_loss",
                      "unknown": "1e-4 * logsumexp(logits)^2 added to the loss"},
    "--unembed-weight-decay 0.1": {"nanogpt": "an untied lm_head with its own weight_decay group",
                                   "hf": "an untied lm_head with its own weight_decay group",
                                   "unknown": "its own weight-decay group"},
    "--set unembed_init_scale=0.01": {
        "nanogpt": "lm_head.weight scaled by 0.01 after GPT's _init_weights (untie it from wte first)",
        "hf": "the lm_head's weight scaled by 0.01 after from_config (an untied head)",
        "unknown": "the output layer's weight scaled by 0.01 at init, its bias zero"},
    "--set act_fn=gelu": {"nanogpt": "nn.GELU() in MLP (nanoGPT's own)", "hf": "activation_function='gelu_new'",
                          "unknown": "GELU in place of ReLU"},
    "--schedule cosine": {"nanogpt": "--decay_lr=True", "hf": "lr_scheduler_type='cosine'",
                          "unknown": "a cosine schedule"},
}


def flag(ours: str, trainer: str) -> str:
    """`ours` (a `python -m train` flag) as the setting of `trainer`'s command line or arguments."""
    if trainer == OURS:
        return ours
    settings = SETTINGS.get(ours, {})
    return settings.get(trainer, settings.get("unknown", ours))
