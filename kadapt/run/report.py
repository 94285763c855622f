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
        ("status", record.get("status", "unknown")),
        ("data", _data_text(options, resolved)),
        ("model", options["model"]),
        ("batch plan", resolved.get("plan", {}).get("text", "not probed")),
        ("epochs", f"{len(history.get('epoch', []))} of {options['epochs']}"),
        ("optimizer steps", f"{len(steps)} logged of {resolved.get('total_steps', '?')}"),
        ("augmentation", resolved.get("augmentation", "?")),
        ("meta-adjuster", f"{options['meta']}, {len(directory.read_jsonl(files.META_DECISIONS))} decision(s)"),
    ]
    rows += [(f"last {key}", f"{values[-1]:.4f}") for key, values in history.items()
             if key != "epoch" and values and isinstance(values[-1], float)]
    if "test_accuracy" in record:
        rows.append(("test accuracy", f"{record['test_accuracy']:.4f} (loss {record['test_loss']:.4f})"))
    if "wall_seconds" in record:
        rows.append(("wall time", f"{record['wall_seconds']:.0f} s"))
    return rows


def format_table(rows):
    """Two aligned columns."""
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _data_text(options, resolved):
    data = resolved.get("data")
    if not data:
        return options["data"]
    return (f"{options['data']}: {data['train_rows']} train / {data['validation_rows']} validation / "
            f"{data['test_rows']} test rows of {tuple(data['input_shape'])}, {data['num_classes']} classes")
