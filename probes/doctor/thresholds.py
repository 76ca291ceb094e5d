"""When the run doctor speaks up: its thresholds, each with where its value comes from."""

from __future__ import annotations

from dataclasses import dataclass

from probes.thresholds import TIMELINE_UNIFORM

__all__ = ["DoctorThresholds"]


@dataclass(frozen=True)
class DoctorThresholds:
    """When the run doctor (`probes.diagnose`) speaks up. Each value says where it comes from;
    the shipped runs' figures are those of `python -m probes.diagnose --ckpt checkpoints/<run>`.

    init_excess_info=1.0, init_excess_warning=2.0 (nats above ln(d_vocab) at step 0): makemore's
    "the initial loss should be about ln(vocab)"; a uniform guess scores exactly ln(d_vocab). The
    series' unscaled init starts its healthy runs 1.1-1.5 nats above (info); `transformer4_nan`
    starts 4.1 above, its logits already large (warning).
    collapse_fraction=0.01 (logged entropy / that of uniform attention): the series' collapsed
    head logged 0.003 nats (0.001 of uniform over 32 tokens) while its sharpest healthy head
    logged 0.158 (0.06): one-hot is two orders below uniform, a sharp healthy head one.
    uniform_fraction: degenerate's TIMELINE_UNIFORM (0.97), so both call the same heads uniform.
    growth_orders=1.0: a series (max attention logit, max |logit|, residual rms, grad norm) that
    grew ten-fold from its first logged value has left its init regime (Wortsman et al. 2023
    watch attention logits grow by orders of magnitude before a loss spike).
    growth_floor=1.0: the residual rms and the attention and output logits grow from at least 1,
    not from an untrained model's near-zero values, so that when the first reading came (step 0
    at eval_every=10 or 100, or later) does not decide the verdict: a layer norm rescales the
    stream to rms 1 (a GPT-2 init's stream at 0.04 growing to 0.7 is the model using its scale,
    not a blow-up), and a score or logit gap of 1 nat is where a softmax starts to differ from
    uniform (scores of 0.1 growing to 1.2 are heads starting to attend). A blow-up starts at or
    above them: a tutorial GPT's stream at 1.5 -> 16, nanochat's at 12.7 -> 3.6e5.
    attn_logit_max=10.0: softmax over a score gap of 10 puts 99.995% of the mass on one key
    (exp(-10) = 4.5e-5): beyond it a head can only be one-hot.
    level_growth=2.0: heads that grew ten-fold past attn_logit_max are warned about while still
    growing (twice or more over the latest quarter of the logged steps); once levelled off they are
    sharp heads, an info (`shakespeare_rms4_adam`: to 34 at step 3000, 1.05x over its last quarter),
    unless past ten times attn_logit_max (a lr 0.3 sweep run: 2.5 to 61 in its first 50 steps,
    then to 4e5 and flat there: a runaway that happened).
    output_logit_max=30.0: a |logit| of 30 gives a log-probability of -30 to its alternatives;
    Wortsman et al.'s output-logit divergence shows as the max |logit| climbing past such values.
    loss_rise=1.0 nats above the loss at the start (or the best so far): a loss that climbs a
    whole nat is going the wrong way (transformer4_nan's val loss rose 4.2 nats in its first step).
    u_high=-1.5, u_low=-5.0 (log10 u, group median over the later half of the run): makemore's
    band is -4..-2 around -3; the shipped healthy runs' groups sit in -4.3..-2.3, so a group is
    reported (info) just outside the band and warned about 0.5 orders above it (u > 3% of the
    weights per step) or one order below it.
    slow_qk_orders=0.75: a block's MLP median log10 u above its Q/K median by this many orders.
    The series under SGD: 0.87 in block 0 of `shakespeare_rms4` (0.83-1.11 over its second half);
    Adam: 0.3 at most.
    dead_info=0.1, dead_warning=0.25: share of units never active on an eval batch (makemore's
    dead ReLUs); `shakespeare_rms4_adam` ends at 5%. relu_zero_info=0.8: share of ReLU outputs
    that are exactly zero in a layer with fewer dead units than dead_info: `sparse_units`, a note
    with no fix (`char_mlp`: 86%, a layer gone sparse though no unit is dead).
    saturated_info=0.1, saturated_warning=0.25: share of tanh/GELU activations in the flat tail
    (makemore: |tanh| > 0.97 should be rare, a few percent).
    overfit_rise=0.05 nats: val loss this far above its best while the train loss kept falling.
    plateau_fraction=0.1, plateau_nats=0.005: no val improvement of 0.005 nats over a tenth of the
    run. The shipped runs improve 0.011-0.03 nats over their slowest tenth. not_learning_nats=0.1:
    a plateau before the loss fell this far below its start means the run is not learning.
    grad_spike=10.0: a gradient norm ten times the scale of the logged ones before it: the larger
    of their recent median (the last 20) and the median of the run's first 20 norms, which does
    not collapse as a classifier's loss and its typical norm fall by orders of magnitude.
    min_points=7 logged losses: with fewer, the overfitting, plateau and spike rules have nothing to
    compare (a plateau needs five evals, a spike a median of three before it): a run that short,
    with nothing above info, is "too short" to judge rather than healthy, unless what it logged
    says enough at any count: learned_fold=10: a loss that fell tenfold from its first value is
    learning (6 evals of a memorising run, 0.47 -> 0.008; an eval loss 15.4 -> 0.30);
    uniform_min_steps=100: two losses at ln(vocab) this many steps apart are stuck (any rate that
    trains moves a model off uniform within tens of steps: its unigram statistics alone are worth
    ~3 nats at GPT-2's 50257 tokens), so uniform_loss judges them.
    rise_fraction=0.5, plateau_relative=0.001, not_learning_fraction=0.02 (of the loss's first
    value): loss_rise, plateau_nats and not_learning_nats without the nats, for a loss that is not
    a next-token cross-entropy (a DPO loss from ln 2, a regression's error in the thousands); the
    same size as the nats on a ~4.5-nat start (0.005 / 4.5 ~ 0.001, 0.1 / 4.5 ~ 0.02).
    plateau_points=5, plateau_min_steps=20: a plateau spans five logged losses and twenty steps at
    least (a 6-step stretch of a 60-step run is noise); the train loss is judged through the median
    of its last five values, not one lucky batch. A loss within ten tolerances of zero (0.05 nats:
    a classifier at 0.004) has converged, with nothing left to gain: no plateau.
    spike_nats=3.0, spike_fraction=1.0: a loss that climbed this far above its first value (three
    nats, a twentyfold worse likelihood; a loss not in nats: double its first value) and came back
    down is a spike (divergence, warning): a hand-written Llama at lr 1 went 4.4 -> 117.7 -> 3.2.
    A step's noise never does that: a healthy run's loss stays below its first value after step 1.
    uniform_margin=0.05 (of ln(vocab)): a loss that never got this far below ln(vocab) (nor
    not_learning_nats) learned nothing: 0.54 nats at GPT-2's 50257 tokens, where text's unigram
    entropy is ~7.5 nats, 0.21 at 65 characters (unigram ~3.3). A share, not nats: the Trainer
    divides a causal LM's summed loss by every label of the batch, the first of each sequence too,
    so a 32-token model at ln(50257) = 10.82 logs 31/32 of it, 10.49.
    lr_decayed=0.1: a schedule already at a tenth of its peak learning rate has decayed; the
    doctor does not advise decaying it again.
    """

    init_excess_info: float = 1.0
    init_excess_warning: float = 2.0
    collapse_fraction: float = 0.01
    uniform_fraction: float = TIMELINE_UNIFORM
    growth_orders: float = 1.0
    growth_floor: float = 1.0
    attn_logit_max: float = 10.0
    level_growth: float = 2.0
    output_logit_max: float = 30.0
    loss_rise: float = 1.0
    u_high: float = -1.5
    u_low: float = -5.0
    slow_qk_orders: float = 0.75
    dead_info: float = 0.1
    dead_warning: float = 0.25
    relu_zero_info: float = 0.8
    saturated_info: float = 0.1
    saturated_warning: float = 0.25
    overfit_rise: float = 0.05
    plateau_fraction: float = 0.1
    plateau_nats: float = 0.005
    not_learning_nats: float = 0.1
    grad_spike: float = 10.0
    min_points: int = 7
    learned_fold: float = 10.0
    uniform_min_steps: int = 100
    rise_fraction: float = 0.5
    plateau_relative: float = 0.001
    not_learning_fraction: float = 0.02
    plateau_points: int = 5
    plateau_min_steps: int = 20
    lr_decayed: float = 0.1
    uniform_margin: float = 0.05
    spike_nats: float = 3.0
    spike_fraction: float = 1.0
