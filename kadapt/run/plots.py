"""PNG plots of a run directory, drawn with matplotlib's Agg canvas (no display)."""

from kadapt.extras import require
from kadapt.run import run_directory as files
from kadapt.run.run_directory import whole_file

MIB = 2**20
_DECISION_COLORS = ("tab:red", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive")


def draw_plots(run):
    """Draws `training.png` (when steps were logged) and `probe.png` (when the
    probe ran) into the `RunDirectory` `run`; returns the paths drawn."""
    drawn = []
    steps = run.read_jsonl(files.STEPS)
    if steps:
        task = (run.read_json(files.CONFIG) or {}).get("resolved", {}).get("data", {}).get("task", {})
        drawn.append(plot_training(steps, run.read_jsonl(files.META_DECISIONS), run.read_json(files.HISTORY, {}),
                                   run / files.TRAINING_PLOT, accuracy=task.get("kind") != "regression"))
    probe = run.read_json(files.PROBE)
    if probe and probe.get("trials"):  # none where the probe was skipped
        drawn.append(plot_probe(probe, run / files.PROBE_PLOT))
    return drawn


def plot_training(steps, decisions, history, path, accuracy=True):
    """Draws `training_figure` to `path`; returns `path`."""
    return _save(training_figure(steps, decisions, history, accuracy), path)


def training_figure(steps, decisions, history, accuracy=True):
    """Learning rate, momentum, loss and (classes: `accuracy`) accuracy
    against the step, one panel each: the loss of every step, and per epoch
    (at its last step) the validation loss and the training and validation
    accuracy. A vertical
    line marks every MetaAdjuster decision, one colour and legend entry per
    kind (its trigger)."""
    figure, axes = _figure(rows=4, height=9.5) if accuracy else _figure(rows=3, height=7.5)
    x = [s["step"] for s in steps]
    for axis, (key, label) in zip(axes, (("learning_rate", "learning rate"), ("momentum", "momentum"))):
        axis.plot(x, [_number(s.get(key)) for s in steps], linewidth=1)
        axis.set_ylabel(label)
    losses = [_number(s.get("loss")) for s in steps]
    axes[2].plot(x, losses, linewidth=0.8, label="training loss (this step)")
    if all(v > 0 for v in losses):
        axes[2].set_yscale("log")
    ends = _epoch_end_steps(steps, history)
    _plot_epochs(axes[2], ends, history, (("val_loss", "validation loss"),), "loss")
    if accuracy:
        _plot_epochs(axes[3], ends, history, (("accuracy", "training accuracy"),
                                              ("val_accuracy", "validation accuracy")), "accuracy")
    for axis in axes:
        _mark_decisions(axis, decisions)
    axes[-1].set_xlabel("optimizer step")
    if decisions:
        axes[0].legend(loc="upper right", fontsize="small")
    axes[0].set_title(f"{len(x)} steps, {len(decisions)} adjustment decision(s)")
    return figure


def _epoch_end_steps(steps, history):
    """The step after each epoch of `history` (where its epoch-end values were measured)."""
    last = {}
    for step in steps:
        last[step.get("epoch")] = step["step"] + 1
    return [last.get(epoch) for epoch in history.get("epoch", [])]


def _plot_epochs(axis, ends, history, series, ylabel):
    for key, label in series:
        points = [(e, v) for e, v in zip(ends, history.get(key, [])) if e is not None and v is not None]
        if points:
            axis.plot(*zip(*points), marker="o", markersize=3, linewidth=1, label=label)
    axis.set_ylabel(ylabel)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="best", fontsize="small")


def _number(value):
    return float("nan") if value is None else float(value)


def plot_probe(probe, path):
    """Peak memory of each probe trial against its micro-batch size, the fitted
    line, the budget and the chosen size."""
    figure, (axis,) = _figure(rows=1, height=4)
    budget = probe["budget"]["bytes"] / MIB
    trials = probe["trials"]
    measured = [t for t in trials if t["peak_bytes"] is not None]
    for fits, color, label in ((True, "tab:green", "fits"), (False, "tab:red", "does not fit")):
        chosen = [t for t in measured if t["fits"] == fits]
        axis.scatter([t["micro_batch_size"] for t in chosen], [t["peak_bytes"] / MIB for t in chosen],
                     color=color, label=label, zorder=3)
    out_of_memory = [t["micro_batch_size"] for t in trials if t["peak_bytes"] is None]
    if out_of_memory:
        axis.scatter(out_of_memory, [budget] * len(out_of_memory), marker="x", color="tab:red",
                     label="out of memory", zorder=3)
    _plot_memory_model(axis, probe.get("memory_model"), [t["micro_batch_size"] for t in trials])
    axis.axhline(budget, color="black", linestyle="--", label=f"budget {budget:.0f} MiB")
    axis.axvline(probe["micro_batch_size"], color="tab:blue", linestyle=":",
                 label=f"chosen micro-batch {probe['micro_batch_size']}")
    axis.set_xlim(left=0)
    axis.set_ylim(bottom=0)
    axis.set_xlabel("micro-batch size (rows)")
    axis.set_ylabel("peak memory (MiB)")
    axis.set_title(f"memory probe on {probe['budget']['device']}")
    axis.legend(fontsize="small")
    return _save(figure, path)


def _plot_memory_model(axis, memory_model, sizes):
    if not memory_model or not sizes:
        return
    top = max(sizes) * 1.1
    line = [memory_model["fixed_bytes"] / MIB, (memory_model["fixed_bytes"] + memory_model["bytes_per_row"] * top) / MIB]
    axis.plot([0, top], line, color="gray", linewidth=1, label="fitted peak = a + b x rows")


def _mark_decisions(axis, decisions):
    kinds = list(dict.fromkeys(d.get("trigger", "decision") for d in decisions))
    labelled = set()
    for decision in decisions:
        kind = decision.get("trigger", "decision")
        count = sum(d.get("trigger", "decision") == kind for d in decisions)
        axis.axvline(decision["step"], color=_DECISION_COLORS[kinds.index(kind) % len(_DECISION_COLORS)],
                     alpha=0.7, linewidth=1, linestyle="--",
                     label=None if kind in labelled else f"MetaAdjuster: {kind} ({count}x)")
        labelled.add(kind)


def _figure(rows, height):
    # A bare `Figure` draws with Agg and touches no pyplot state: no display
    # needed, nothing left open in the caller's process.
    Figure = require("matplotlib.figure", extra="plots").Figure

    figure = Figure(figsize=(8, height))
    axes = figure.subplots(rows, 1, sharex=True, squeeze=False)
    return figure, list(axes[:, 0])


def _save(figure, path):
    figure.tight_layout()
    with whole_file(path) as temporary:  # `kadapt report --redraw` may draw while a reader opens the file
        figure.savefig(temporary, dpi=100)
    return path
