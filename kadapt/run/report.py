"""The summary table of a run directory (`kadapt report`)."""

from kadapt.run import run_directory as files
from kadapt.run.errors import UsageError


def summary(directory):
    """`(label, value)` rows describing the `RunDirectory` `directory`."""
    config = directory.read_json(files.CONFIG)
    if config is None:
        raise UsageError(f"{directory.path} holds no {files.CONFIG}: it is not a kadapt run directory.")
    options, resolved = config["options"], config.get("resolved", {})
    record = directory.read_json(files.RUN, {})
    history = directory.read_json(files.HISTORY, {})
    steps = directory.read_jsonl(files.STEPS)
    rows = [
        ("run directory", str(directory.path)),
        ("status", _status_text(directory, record.get("status", "unknown"))),
        ("data", _data_text(options, resolved)),
        ("model", resolved.get("model", options["model"])),
        ("batch plan", resolved.get("plan", {}).get("text", "not probed")),
        ("epochs", f"{len(history.get('epoch', []))} of {options['epochs']}"),
        ("optimizer steps", f"{len(steps)} logged of {resolved.get('total_steps', '?')}"),
        ("augmentation", resolved.get("augmentation", "?")),
        ("meta-adjuster", f"{options['meta']}, {len(directory.read_jsonl(files.META_DECISIONS))} decision(s)"),
    ]
    if "weights" in record:
        rows.append(("saved weights", record["weights"]["text"]))
    if "test_loss" in record:
        label = "test accuracy" if "test_accuracy" in record else "test error"
        rows.append((label, scores_text(record, label=False)))
    if "wall_seconds" in record:
        rows.append(("wall time", f"{record['wall_seconds']:.0f} s"))
    if "seconds" in record:
        rows.append(("time split", seconds_text(record["seconds"])))
    return rows


def in_progress_text(directory):
    """`"run in progress: ..."` while a run holds the `RunDirectory` `directory`, else `""`."""
    pid = directory.holder()
    if pid is None:
        return ""
    return f"run in progress: {f'process {pid}' if pid else 'a process'} is still training {directory.path}"


def _status_text(directory, status):
    """`run.json`'s status; one that says the run is at work while no process holds the
    directory is that of a run killed before it could record how it ended."""
    if status not in files.ACTIVE or directory.holder() is not None:
        return status
    return (f"{status} when its process ended without a record (killed?): `kadapt train --resume --out "
            f"{directory.path}` continues it")


def seconds_text(seconds):
    """`{phase: seconds}` (`run.json`'s `"seconds"`) as one line: each phase of 0.05 s or more, then the total."""
    parts = [f"{name} {value:.1f} s" for name, value in seconds.items() if value >= 0.05]
    return f"{', '.join(parts)} (total {sum(seconds.values()):.0f} s)"


def scores_text(record, label=True):
    """The test scores of a `run.json` record: accuracy and loss, or a regression's errors."""
    if "test_accuracy" in record:
        text = f"{record['test_accuracy']:.4f} (loss {record['test_loss']:.4f})"
        return f"test accuracy {text}" if label else text
    text = (f"MAE {record['test_mae']:.4g}, RMSE {record['test_rmse']:.4g}, R² {record['test_r2']:.4f} "
            f"(MSE {record['test_mse']:.4g})")
    return f"test {text}" if label else text


def format_table(rows):
    """Two aligned columns."""
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


EPOCH_COLUMNS = (("loss", "loss"), ("accuracy", "accuracy"), ("val_loss", "val loss"),
                 ("val_accuracy", "val accuracy"), ("meta_learning_rate", "learning rate"),
                 ("meta_adjustments", "decisions"))


def epoch_table(directory):
    """One row per finished epoch of `history.json`: the losses, accuracies,
    the learning rate at its end and the MetaAdjuster decisions in it; `""`
    when no epoch finished."""
    history = directory.read_json(files.HISTORY, {})
    columns = [(key, title) for key, title in EPOCH_COLUMNS if key in history]
    if not history.get("epoch"):
        return ""
    header = ["epoch"] + [title for _, title in columns]
    body = [[str(epoch + 1)] + [_cell(history[key][i]) for key, _ in columns]
            for i, epoch in enumerate(history["epoch"])]
    widths = [max(len(row[c]) for row in [header] + body) for c in range(len(header))]
    lines = [header, ["-" * w for w in widths]] + body
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)


def _cell(value):
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _data_text(options, resolved):
    data = resolved.get("data")
    if not data:
        return options["data"]
    task = data.get("task", {}).get("kind", "classification")
    predicted = (f"regression of {data.get('target') or 'the target'}" if task == "regression"
                 else f"{data['num_classes']} classes")
    columns = f" ({len(data['columns'])} columns)" if data.get("columns") else ""
    return (f"{options['data']}: {data['train_rows']} train / {data['validation_rows']} validation / "
            f"{data['test_rows']} test rows of {tuple(data['input_shape'])}{columns}, {predicted}")
