"""The memory probe in words: its budget line, one line per trial as it runs,
and the table of all trials. `kadapt probe` and `kadapt train` print these."""

MIB = 2**20


def budget_line(model_name: str, budget) -> str:
    """What is probed where: `budget` is a `kadapt.batching.MemoryBudget`; on a GPU, what its peaks count."""
    line = f"probing {model_name} on {budget.device}, budget {budget.bytes / MIB:.1f} MiB ({budget.source})"
    if not budget.device.upper().startswith("GPU"):
        return line
    from kadapt.batching.tensorflow.allocator_mode import COUNTS
    from kadapt.batching.tensorflow.allocator_mode import allocator_mode

    mode = allocator_mode(budget.device)
    return f"{line}; allocator {mode}: peaks count {COUNTS[mode]}"


def check_probe_allocator(device: str) -> None:
    """Raises `UsageError` where the probe's trial steps cannot be trusted (GPU memory growth)."""
    from kadapt.batching.tensorflow.allocator_mode import allocator_mode
    from kadapt.batching.tensorflow.allocator_mode import growth_reason
    from kadapt.run.errors import UsageError

    if device.upper().startswith("GPU") and allocator_mode(device) == "bfc-growth":
        raise UsageError(f"kadapt measures the micro-batch with trial steps, which it cannot do with "
                         f"{growth_reason(device)}. Received: allocator mode 'bfc-growth'")


def trial_line(trial) -> str:
    """One `kadapt.batching.ProbeTrial` as it finishes (the probe's `on_trial`)."""
    peak = "out of memory" if trial.peak_bytes is None else f"{trial.peak_bytes / MIB:9.1f} MiB"
    return (f"  trial micro-batch {trial.micro_batch_size:6d}: {peak}, {'fits' if trial.fits else 'does not fit'}"
            f", {trial.compiles} compile{'' if trial.compiles == 1 else 's'}")


def trial_table(result) -> str:
    """Every trial of a `kadapt.batching.ProbeResult`, and the chosen micro-batch."""
    lines = [f"{'micro-batch':>11s} {'peak MiB':>10s} {'samples/s':>10s}  fits"]
    for t in result.trials:
        peak = "OOM" if t.peak_bytes is None else f"{t.peak_bytes / MIB:.1f}"
        speed = "-" if t.samples_per_second is None else f"{t.samples_per_second:.0f}"
        lines.append(f"{t.micro_batch_size:11d} {peak:>10s} {speed:>10s}  {'yes' if t.fits else 'no'}")
    lines.append(f"chosen micro-batch: {result.micro_batch_size} ({result.compiles} compiles)")
    return "\n".join(lines)
