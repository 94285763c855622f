"""PNG plots of a run directory, drawn with matplotlib's Agg canvas (no display)."""

from kadapt.run import run_directory as files

MIB = 2**20


def draw_plots(run):
    """Draws `training.png` (when steps were logged) and `probe.png` (when the
    probe ran) into the `RunDirectory` `run`; returns the paths drawn."""
    drawn = []
    steps = run.read_jsonl(files.STEPS)
    if steps:
        drawn.append(plot_training(steps, run.read_jsonl(files.META_DECISIONS), run / files.TRAINING_PLOT))
    probe = run.read_json(files.PROBE)
    if probe:
        drawn.append(plot_probe(probe, run / files.PROBE_PLOT))
    return drawn


def plot_training(steps, decisions, path):
    """Learning rate, momentum and loss against the step, one panel each, with
    a vertical line at every MetaAdjuster decision."""
    figure, axes = _figure(rows=3, height=7.5)
    x = [s["step"] for s in steps]
    panels = (("learning_rate", "learning rate", "linear"), ("momentum", "momentum", "linear"),
              ("loss", "loss (this step)", "log"))
    for axis, (key, label, scale) in zip(axes, panels):
        values = [s.get(key) for s in steps]
        axis.plot(x, [float("nan") if v is None else v for v in values], linewidth=1)
        axis.set_ylabel(label)
        if scale == "log" and all(v is not None and v > 0 for v in values):
            axis.set_yscale("log")
        _mark_decisions(axis, decisions)
    axes[-1].set_xlabel("optimizer step")
    if decisions:
        axes[0].legend(loc="upper right", fontsize="small")
    axes[0].set_title(f"{len(x)} steps, {len(decisions)} adjustment decision(s)")
    return _save(figure, path)


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
    for index, decision in enumerate(decisions):
        label = f"{decision.get('trigger')}: {decision.get('adjustment')}"
        axis.axvline(decision["step"], color="tab:red", alpha=0.6, linewidth=1,
                     label=label if index < 8 else None)


def _figure(rows, height):
    # A bare `Figure` draws with Agg and touches no pyplot state: no display
    # needed, nothing left open in the caller's process.
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, height))
    axes = figure.subplots(rows, 1, sharex=True, squeeze=False)
    return figure, list(axes[:, 0])


def _save(figure, path):
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path
