"""The callbacks of a `kadapt train` run, in the order they must run."""

import keras

from kadapt.meta import DeadRunRescue
from kadapt.meta import MetaAdjuster
from kadapt.meta import RangeTestStart
from kadapt.meta import RestartTrial
from kadapt.meta import load_meta_model
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.run import run_directory as files
from kadapt.run.backup import InterruptSafeBackup
from kadapt.run.errors import UsageError
from kadapt.run.history_writer import HistoryWriter
from kadapt.run.step_logger import StepLogger
from kadapt.run.stopping import StopAtStep
from kadapt.run.stopping import StopAtTarget

# The training rows a rescue's range test and a judged restart read of a streamed table (spread over it).
IN_MEMORY_ROWS = 65536


def training_callbacks(run, steps, schedule_callbacks, best_weights, first_epoch):
    """Backup first (it restores weights before the others look at them) and
    its committer last (an epoch's checkpoint follows that epoch's records);
    the schedule's momentum set before the step logger reads it; the step
    logger before the MetaAdjuster (`self_tuning`) changes anything at batch
    end; the best weights kept before the history is written.

    Args:
        run: `Run`. Its plan, directory and data.
        steps: Dict with `total_steps` and `train_rows` (expanded samples included).
        schedule_callbacks: The recipe's (`recipe_callbacks`).
        best_weights: The recipe's `best_weights_callback`, or `None`.
        first_epoch: Int. The epoch the training data starts at: the
            checkpointed one on a resume, else 0. The backup checks that it
            restores that epoch.
    """
    config, directory = run.plan.config, run.directory
    (directory / files.META_DECISIONS).touch()  # empty with --meta off, until a rescue
    # Two checkpoints, and none cut short by Ctrl-C.
    backup = InterruptSafeBackup(backup_dir=str(directory / files.BACKUP), double_checkpoint=True,
                                 first_epoch=first_epoch, save_scope=run.local)
    callbacks = [
        backup,
        *schedule_callbacks,
        StepLogger(directory / files.STEPS, config.batch_size, steps["train_rows"]),
        self_tuning(run),
        best_weights,  # before the history: an epoch on disk is one whose checkpoint follows at once
        HistoryWriter(directory / files.HISTORY),
        keras.callbacks.TensorBoard(log_dir=str(directory / files.TENSORBOARD), write_graph=False),
    ]
    if config.target_accuracy is not None:
        callbacks.append(StopAtTarget(config.target_accuracy))
    if config.max_steps is not None:
        callbacks.append(StopAtStep(config.max_steps))
    callbacks.append(backup.committer)
    return [c for c in callbacks if c is not None]


def self_tuning(run):
    """The run's one `kadapt.meta.MetaAdjuster`: the meta-model (`run.meta_model`;
    none with `--meta off`), the dead-run rescue as its part (`dead_run_rescue`,
    on with or without the meta-model), and a judged restart on the training
    and validation rows (`kadapt.meta.RestartTrial`; not in a multi-worker run,
    where each worker would judge on its own rows). It writes
    `meta_decisions.jsonl` and saves its state (the rescue's within) beside the
    backup at every epoch end, so `--resume` continues its history, rollback
    points, ceiling, rescue and decision log. What the run's data gives is
    passed, so nothing is derived from a sample of fit's rows. `None` in a
    multi-worker run with `--meta off` (no rescue there either)."""
    config, data, directory = run.plan.config, run.data, run.directory
    rescue = dead_run_rescue(run)
    if run.meta_model is None and rescue is None:
        return None  # a multi-worker run with --meta off: nothing to tune
    trial = None if run.member is not None or run.meta_model is None else _restart_trial(config, data)
    with run.local():  # the meta-model's weights are read outside a JAX run's distribution
        return MetaAdjuster(meta_model=run.meta_model, monitor=_monitor(data), check_every="epoch",
                            log_dir=str(directory.path), backup_dir=str(directory / files.BACKUP),
                            restart_trial=trial, rescue=rescue or False)


def dead_run_rescue(run):
    """`kadapt.meta.DeadRunRescue` on the run's data, the part of `self_tuning`'s
    MetaAdjuster: on by default, with or without the meta-model (`--meta off`
    turns the meta-model off, not this rule); `None` in a multi-worker run.

    Chance is the loss of the constant predictor fit on the training targets,
    on the rows the rescue monitors (`TrainingData.chance_loss`: the smoothed
    cross-entropy, or the standardized target's mean squared distance from
    the training mean; a heavy-tailed target's validation rows can sit well
    above the training variance), and on the training rows for the training
    loss (a run learning its training rows is not dead); a rescue's new rate comes from a range test on the training rows
    (after a divergence ten times its suggestion, at most a tenth of the rate that diverged; a rate / 10
    where the test reads none), as the schedule's peak."""
    if run.member is not None:
        return None  # each worker would range-test on its own rows, and could set another rate
    config, data = run.plan.config, run.data
    smoothing = run.plan.recipe.label_smoothing
    chance = data.chance_loss(smoothing, on_validation=_monitor(data) == "val_loss")
    x, y, *_ = data.in_memory(IN_MEMORY_ROWS)
    range_test = RangeTestStart(x, y, batch_size=config.batch_size, seed=config.seed)
    rule = DeadRunRule(chance, training_chance_loss=data.chance_loss(smoothing))
    return DeadRunRescue(rule, monitor=_monitor(data), range_test=range_test,
                         peak_learning_rate=run.plan.recipe.learning_rate)


def _monitor(data):
    return "val_loss" if len(data.x_val) else "loss"


def meta_model(config):
    """The meta-model `--meta` names, loaded, or `None` for `--meta off`.

    Loaded before the run starts, so a meta-model that cannot be loaded is a
    `UsageError` before anything is written.
    """
    if config.meta == "off":
        return None
    try:
        return load_meta_model(config.meta)
    except (ValueError, TypeError, OSError) as error:
        raise UsageError(f"--meta {config.meta}: {' '.join(str(error).split())}") from None


def _restart_trial(config, data):
    x, y, x_val, y_val = data.in_memory(IN_MEMORY_ROWS)
    validation = (x_val, y_val) if len(x_val) else None
    return RestartTrial(x, y, validation_data=validation, batch_size=config.batch_size, seed=config.seed)
