"""The `kadapt train` job: probe -> plan -> accumulate -> cosine LR and
momentum -> augmentation -> MetaAdjuster -> evaluation -> save.

`start_run` checks everything the user gave before it writes anything;
`train` then runs the job in the run directory. An interrupt (Ctrl-C) leaves
the directory consistent: config, the epochs that finished, the steps
logged, `run.json` with status "interrupted" and the `BackupAndRestore`
state that `--resume` continues from.
"""

import dataclasses
import time

import keras

from kadapt.batching import accumulate
from kadapt.batching import plan_batch
from kadapt.batching import probe_micro_batch
from kadapt.batching.memory_budget import device_budget
from kadapt.optimizers import SGD
from kadapt.run import run_directory as files
from kadapt.run.augmentation import augmentation_pipeline
from kadapt.run.callbacks import meta_adjuster
from kadapt.run.callbacks import training_callbacks
from kadapt.run.config import resolve_config
from kadapt.run.config import schedule_steps
from kadapt.run.data import load_data
from kadapt.run.errors import UsageError
from kadapt.run.input_pipeline import training_dataset
from kadapt.run.networks import build_model
from kadapt.run.plots import draw_plots
from kadapt.run.run_directory import RunDirectory
from kadapt.schedules import CosineAnnealing


@dataclasses.dataclass
class Run:
    """What `start_run` prepared: the config, directory, data, network and
    MetaAdjuster (`None` with `--meta off`)."""

    config: object
    directory: RunDirectory
    data: object
    model: object
    meta_adjuster: object
    resume: bool


def start_run(options, out, overwrite=False, resume=False):
    """Validates the options, data, network and output directory, then
    creates the directory. Raises `UsageError` before writing anything."""
    directory = RunDirectory(out)
    directory.check_new_run(overwrite, resume)
    saved = directory.read_json(files.CONFIG)["options"] if resume else None
    config = resolve_config(options, saved)
    data = load_data(config)
    keras.utils.set_random_seed(config.seed)
    model = build_model(config.model, data.input_shape, data.num_classes)
    adjuster = meta_adjuster(config, directory, data)
    directory.create(overwrite)
    return Run(config, directory, data, model, adjuster, resume)


def train(run, echo=print):
    """Trains `run` (from `start_run`) and returns its `run.json` record."""
    started = time.time()
    config, directory, data = run.config, run.directory, run.data
    steps = dict(zip(("steps_per_epoch", "total_steps", "warmup_steps"),
                     schedule_steps(config, len(data.x_train))))
    _compile(run.model, config, steps)
    augmentation, augmentation_text = augmentation_pipeline(config.augment, config.data, data, config.seed)
    resolved = {**steps, "data": data.summary(), "augmentation": augmentation_text,
                "learning_rate_min": config.learning_rate * config.min_learning_rate_ratio}
    _write_config(directory, config, resolved)
    directory.update_run(status="probing", started_at=_now(), resumed=run.resume)
    try:
        micro = _micro_batch_size(run, echo)
        _write_config(directory, config, {**resolved, "plan": _plan(config.batch_size, micro)})
        trainer = _trainer(run, micro)
        directory.update_run(status="training", micro_batch_size=micro)
        _fit(run, trainer, augmentation, steps, micro)
    except KeyboardInterrupt:
        directory.update_run(status="interrupted", interrupted_at=_now())
        draw_plots(directory)
        raise
    except Exception as error:
        directory.update_run(status="failed", error=f"{type(error).__name__}: {error}")
        raise
    return _finish(run, trainer, micro, started, echo)


def _write_config(directory, config, resolved):
    """`config.json`: the options as given or defaulted, and what they resolved to."""
    directory.write_json(files.CONFIG, {"options": config.to_dict(), "resolved": resolved})


def _compile(model, config, steps):
    schedule = CosineAnnealing(
        config.learning_rate, config.learning_rate * config.min_learning_rate_ratio,
        steps["total_steps"], steps["warmup_steps"],
    )
    optimizer = SGD(
        schedule, momentum=config.momentum_max, nesterov=True, weight_decay=config.weight_decay
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def _micro_batch_size(run, echo):
    """The probed micro-batch (the saved probe's on a resume); writes probe.json and probe.png."""
    saved = run.directory.read_json(files.PROBE) if run.resume else None
    if saved is not None:
        echo(f"resuming with the probed micro-batch {saved['micro_batch_size']}")
        return saved["micro_batch_size"]
    result = _probe(run, echo)
    run.directory.write_json(files.PROBE, result.to_dict())
    draw_plots(run.directory)
    echo(f"plan: {_plan(run.config.batch_size, result.micro_batch_size)['text']}")
    return result.micro_batch_size


def _probe(run, echo):
    config, data = run.config, run.data
    budget = device_budget(config.memory_budget)
    echo(f"probing {config.model} on {budget.device}, budget {budget.bytes / 2**20:.1f} MiB ({budget.source})")
    rows = slice(0, 2 * config.batch_size)

    def on_trial(trial):
        peak = "out of memory" if trial.peak_bytes is None else f"{trial.peak_bytes / 2**20:9.1f} MiB"
        echo(f"  trial micro-batch {trial.micro_batch_size:6d}: {peak}, "
             f"{'fits' if trial.fits else 'does not fit'}")

    try:
        return probe_micro_batch(
            run.model, (data.x_train[rows], data.y_train[rows]), memory_budget=config.memory_budget,
            max_micro_batch_size=config.batch_size, on_trial=on_trial,
        )
    except ValueError as error:  # the budget holds not even one row
        raise UsageError(" ".join(str(error).split())) from None


def _plan(batch_size, micro):
    plan = plan_batch(batch_size, micro)
    return {**dataclasses.asdict(plan), "text": str(plan)}


def _trainer(run, micro):
    trainer = accumulate(run.model, micro, memory_budget=run.config.memory_budget)
    trainer(run.data.x_train[:1])  # BackupAndRestore restores into a built model
    return trainer


def _fit(run, trainer, augmentation, steps, micro):
    config, data = run.config, run.data
    callbacks = training_callbacks(run, steps)
    validation = (data.x_val, data.y_val) if len(data.x_val) else None
    try:
        trainer.fit(
            training_dataset(data.x_train, data.y_train, config.batch_size, config.seed, augmentation),
            epochs=config.epochs, validation_data=validation, validation_batch_size=micro,
            callbacks=callbacks, verbose=1, shuffle=False,  # the dataset shuffles, seeded
        )
    finally:
        for callback in callbacks:
            if hasattr(callback, "close"):
                callback.close()


def _finish(run, trainer, micro, started, echo):
    directory, data = run.directory, run.data
    scores = trainer.evaluate(data.x_test, data.y_test, batch_size=micro, verbose=0, return_dict=True)
    run.model.save(directory / files.MODEL)
    history = directory.read_json(files.HISTORY, {})
    record = {
        "status": "completed", "finished_at": _now(),
        "wall_seconds": round(time.time() - started, 1),
        "epochs_completed": len(history.get("epoch", [])),
        "steps_completed": int(trainer.optimizer.iterations.numpy()),
        "test_loss": float(scores["loss"]), "test_accuracy": float(scores["accuracy"]),
    }
    directory.update_run(**record)
    plots = draw_plots(directory)
    echo(f"test accuracy {record['test_accuracy']:.4f} (loss {record['test_loss']:.4f}) "
         f"after {record['steps_completed']} steps, {record['wall_seconds']:.0f} s")
    echo(f"run directory {directory.path}; plots: {', '.join(str(p) for p in plots)}")
    return directory.read_json(files.RUN)


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
