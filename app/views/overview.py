"""Overview: what is this model, how did its training go, and what does it write?"""

from __future__ import annotations

import streamlit as st

from app import axes, charts, data, logs, run_files, series, warm
from app.rescue_marks import with_rescues
from app.views import doctor, live
from app.views.controls import curve_controls, smoothed_frame
from app.views.common import Selection, first_line, no_weights_text, page, saved_note, show


@page("Overview", "What is this model, how did training go, and what does it write?", needs_model=False)
def render(sel: Selection) -> None:
    follow = sel.run.is_run and live.follow_toggle(sel.run, "follow_overview")
    # the run's log first: it shows even when a snapshot is broken, and before the model loads
    live.live(run_log, follow)(sel, follow)
    facts = st.container()  # the model's numbers, filled in once the model is loaded
    if sel.snapshot is None:  # a history-only run: its log is all there is
        st.info(no_weights_text(sel.run.path))
        return
    warm.before_first_model()  # the charts above are drawn first
    snap = data.snapshot(sel.snapshot, sel.run.preset)
    with facts:
        model_facts(snap)
    if data.saved_only(snap):  # no code to run: nothing to write with
        saved_note(snap)
        return
    samples(sel, snap.config)


TOKENS_UNTOLD = ("this run did not count the tokens it trained on: give the Monitor the tokens of one step, "
                 "Monitor(..., tokens_per_step=batch_size * context)")


def model_facts(snap) -> None:
    from models.layout import parameter_count  # the model is loaded here: torch is too
    n_params = parameter_count(snap.model)
    cols = st.columns(4)
    cols[0].metric("parameters", f"{n_params:,}")
    cols[1].metric("step", "-" if snap.step is None else f"{snap.step:,}")
    if snap.tokens_seen is None or (snap.tokens_seen == 0 and (snap.step or 0) > 0):  # 0 after steps: never counted
        cols[2].metric("tokens seen", "not logged", help=TOKENS_UNTOLD)
    else:
        cols[2].metric("tokens seen", f"{snap.tokens_seen / 1e6:.2f}M")
    tok = snap.tokenizer
    cols[3].metric("tokenizer", "none" if tok is None else f"{tok.kind} ({tok.vocab_size})")
    broken = snap.nonfinite_params()
    if broken:
        st.error(f"{len(broken)} parameters hold NaN or inf: this snapshot diverged")
    with st.expander("model config"):
        st.json(snap.config.to_dict())


def run_log(sel: Selection, follow: bool) -> None:
    """The doctor's verdict, the loss curves right under it (in the first screen), then its findings."""
    drawn = sel.run.is_run or doctor.diagnosable(sel.run)  # ours, or a log the doctor reads (its curves too)
    doctor.section(sel, between=(lambda: curves(sel, follow)) if drawn else None)


def curves(sel: Selection, follow: bool = False) -> None:
    if follow:
        live.rerun_if_snapshots_changed(sel.run)  # the sidebar's slider must offer a new snapshot
    history = logs.history_log(sel.run.path)
    records = history.records
    losses = series.rows(records, {"train loss": "train_loss", "val loss": "val_loss"}, "loss")
    if not losses:
        st.info("This run logged no losses yet.")
        return
    st.caption(run_files.records_caption(history))
    mode, weight = curve_controls("loss")
    left, right = st.columns(2)
    key, column, title = bits_curve(records)
    bpc = series.rows(records, {f"val {column}": key}, column)
    steps = axes.x_range(r["step"] for r in losses + bpc)  # the two charts side by side share their steps
    y = axes.choose_y([r["loss"] for r in losses], mode)
    loss = charts.smoothed_over_steps(smoothed_frame(losses, "loss", "curve", weight), "loss", "curve",
                                      charts.titled("loss", y.note), log=y.log, y_title="loss (nats per token)",
                                      x_domain=steps)
    loss = with_rescues(loss, records)  # the guard's rescues, from the records (app.rescue_marks)
    show(charts.with_findings(loss, doctor.marks(sel.run)), left, stretch=True)
    if bpc:
        y = axes.choose_y([r[column] for r in bpc], mode)
        show(charts.smoothed_over_steps(smoothed_frame(bpc, column, "curve", weight), column, "curve",
                                        charts.titled(title, y.note), log=y.log,
                                        y_title=f"{column} ({title})", x_domain=steps),
             right, stretch=True)
    diverged = [r for r in records if r.get("diverged")]
    if diverged:
        d = diverged[0]["diverged"]
        st.error(f"Training diverged at step {diverged[0]['step']}: {d.get('reason')}")


def bits_curve(records: list[dict]) -> tuple[str, str, str]:
    """The second chart's record key, column and title: our BPC, else nanochat's val_bpb (bits per
    byte: a tokenizer-free loss, so runs with different vocabularies compare on it)."""
    if not any("bpc" in r for r in records) and any("val_bpb" in r for r in records):
        return "val_bpb", "BPB", "bits per byte"
    return "bpc", "BPC", "bits per character"


def samples(sel: Selection, cfg) -> None:
    st.subheader("What it writes")
    mlp = cfg.family == "mlp"  # its window is fixed: the prompt must fill it
    default = (sel.text or "ROMEO: But soft, what light")[: cfg.n_ctx] if mlp else "ROMEO:"
    typed = st.text_input("prompt" + (f" (at least {cfg.n_ctx} characters)" if mlp else ""),
                          value=data.shown_newlines(default), key=f"prompt:{cfg.family}",
                          help=f"{data.NEWLINE} is a new line (type it, or paste one).")
    prompt = data.real_newlines(typed)
    c1, c2, c3 = st.columns(3)
    n = c1.slider("new tokens", 20, 400, 160, step=20)
    temperature = c2.slider("temperature", 0.1, 2.0, 0.8, step=0.1)
    seed = c3.number_input("seed", 0, 10_000, 0)
    left, right = st.columns(2)
    for column, greedy, title in ((left, True, "greedy"), (right, False, f"sampled (T = {temperature})")):
        try:
            text = data.sample(*sel.key[:2], prompt, n, greedy, temperature, int(seed), sel.run.preset)
        except ValueError as exc:  # the prompt or the model, not the decoding: say it once, for both
            st.error(first_line(exc))
            return
        column.markdown(f"**{title}**")
        column.code(prompt + text, language=None, wrap_lines=True)


# the page: Streamlit runs this file afresh as `__main__` on each load (app/shell.py's navigation); it
# draws with the imported module, so that every load shares one copy of it; an import draws nothing
if __name__ == "__main__":
    from app.views import overview
    from app.views.common import current

    overview.render(current())  # app/main.py put the sidebar's selection in session state
