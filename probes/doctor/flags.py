"""The fixes name a setting the user can change: `python -m train`'s flag for our runs, the same
setting in nanoGPT's train.py, llm.c's command line, Lightning's Trainer or the Hugging Face
Trainer's TrainingArguments for theirs, and plain words where the trainer is unknown (TensorBoard
events say nothing of who wrote them, unless Lightning's tag names do). `MONITOR_HINTS` say, in
each trainer's own terms, how to log what the doctor needs for the rules a foreign log cannot feed."""

from __future__ import annotations

__all__ = ["DEFAULT_CLIP", "MONITOR_HINTS", "OURS", "TRAINERS", "flag", "monitor_hint"]

OURS = "scratchscope"
TRAINERS = (OURS, "nanogpt", "hf", "lightning", "llmc", "unknown")
# the clipping a trainer applies unless told otherwise: nanoGPT's grad_clip = 1.0, the Trainer's
# max_grad_norm=1.0, llm.c's grad_clip = 1.0f (train_gpt2.cu); Lightning's gradient_clip_val=None
DEFAULT_CLIP = {"nanogpt": 1.0, "hf": 1.0, "llmc": 1.0, "lightning": 0.0}

MONITOR_HINTS = {
    "hf": "add the callback: trainer.add_callback(train.monitor.HFCallback('runs/x')) "
          "(see docs/monitor.md)",
    "nanogpt": "in nanoGPT's train.py, three lines: monitor = Monitor(model, optimizer, 'runs/x') before the "
               "loop, monitor.log(iter_num, train_loss=lossf) in it, monitor.close() after "
               "(train.monitor.Monitor; see docs/monitor.md)",
    "lightning": "in the LightningModule, train.monitor.Monitor(self, optimizer, 'runs/x') made in "
                 "configure_optimizers and monitor.log(self.global_step, train_loss=loss) in training_step "
                 "(see docs/monitor.md)",
    "unknown": "log it with train.monitor.Monitor: monitor = Monitor(model, optimizer, 'runs/x'), then "
               "monitor.log(step, train_loss=loss) in the loop (see docs/monitor.md)",
}

# our flag -> {trainer: its setting}; "unknown" is the words used when the trainer is not known
SETTINGS: dict[str, dict[str, str]] = {
    "--grad-clip 1.0": {"nanogpt": "--grad_clip=1.0", "hf": "max_grad_norm=1.0",
                        "lightning": "Trainer(gradient_clip_val=1.0)", "llmc": "grad_clip = 1.0f",
                        "unknown": "torch.nn.utils.clip_grad_norm_(params, 1.0)"},
    # never one that overwrites the best weights: nanoGPT's always_save_checkpoint=False keeps the
    # best val loss's ckpt.pt (True overwrites it with the last); the Trainer keeps the best itself
    "--save-every": {"nanogpt": "--always_save_checkpoint=False, so that ckpt.pt holds the best val loss",
                     "hf": "load_best_model_at_end=True with metric_for_best_model='eval_loss', "
                           "save_total_limit >= 2",
                     "lightning": "ModelCheckpoint(monitor='val_loss', save_top_k=1)",
                     "unknown": "a checkpoint kept whenever the val loss reaches a new best"},
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
                          "llmc": "-k cosine -q 0.0", "lightning": "a CosineAnnealingLR in configure_optimizers",
                          "unknown": "a cosine schedule"},
}


def flag(ours: str, trainer: str) -> str:
    """`ours` (a `python -m train` flag) as the setting of `trainer`'s command line or arguments."""
    if trainer == OURS:
        return ours
    settings = SETTINGS.get(ours, {})
    return settings.get(trainer, settings.get("unknown", ours))


def monitor_hint(trainer: str) -> str:
    """How a user of `trainer` logs what the doctor reads beyond the losses, in that trainer's terms."""
    return MONITOR_HINTS.get(trainer, MONITOR_HINTS["unknown"])
