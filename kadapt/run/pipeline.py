"""The `kadapt train` job: the recipe of `kadapt.recipes` (network,
schedule, augmentation, label smoothing, test-time augmentation) with
probe -> plan -> accumulate, the MetaAdjuster, evaluation and save, in a run
directory.

`start_run` checks everything the user gave before it writes anything,
resolving the options once into a `kadapt.run.train_plan.TrainPlan` that
everything after reads; `train` then runs the job in the run directory. An interrupt (Ctrl-C) leaves
the directory consistent: config, the epochs that finished, the steps
logged, `run.json` with status "interrupted" and the `BackupAndRestore`
state that `--resume` continues from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING

import keras

from kadapt.batching import balanced_micro_batch
from kadapt.batching import plan_batch
from kadapt.batching import probe_micro_batch
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.trivial_fit import SKIP_FRACTION
from kadapt.batching.trivial_fit import model_output_units
from kadapt.batching.trivial_fit import step_bytes_bound
from kadapt.batching.trivial_fit import trivially_fits
from kadapt.models.table_mlp import network_text
from kadapt.precision import PrecisionChoice
from kadapt.precision import global_policy
from kadapt.recipes import training
from kadapt.run import run_directory as files
from kadapt.run.backup import InterruptSafeBackup
from kadapt.run.callbacks import meta_model
from kadapt.run.callbacks import training_callbacks
from kadapt.run.config import resolve_config
from kadapt.run.config import schedule_steps
from kadapt.run.data import TrainingData
from kadapt.run.data import load_data
from kadapt.run.errors import UsageError
from kadapt.run.image_folders import ImageSize
from kadapt.run.image_folders import images_text
from kadapt.run.image_folders import raw_image_model
from kadapt.run.networks import build_network
from kadapt.run.phases import FirstStepClock
from kadapt.run.phases import PhaseClock
from kadapt.run.plots import draw_plots
from kadapt.run.probe_text import budget_line
from kadapt.run.probe_text import check_probe_allocator
from kadapt.run.probe_text import trial_line
from kadapt.run.report import scores_text
from kadapt.run.run_directory import RunDirectory
from kadapt.run.run_directory import whole_file
from kadapt.run.train_plan import TrainPlan
from kadapt.run.train_plan import plan_training

if TYPE_CHECKING:
    from kadapt.run.jax_workers import JaxProcess
    from kadapt.run.run_lock import RunLock
    from kadapt.run.workers import ClusterMember

# model.keras and its temporary copy, the backup's checkpoint and its previous one, each with the
# optimizer's slots (Adam: two per weight), and the best epoch's weights.
RUN_COPIES = 9
LOG_BYTES = 2**20


@dataclasses.dataclass
class Run:
    """What `start_run` prepared: the plan, directory, data, network and
    meta-model (`None` with `--meta off`).

    `plan` is replaced once, by `train`, where a range test finds the rate
    (`TrainPlan.with_found_rate`); nothing else changes after `start_run`."""

    plan: TrainPlan
    directory: RunDirectory
    data: TrainingData
    model: keras.Model
    precision: PrecisionChoice  # the one the network was built under
    resume: bool
    meta_model: keras.Model | None = None  # the MetaAdjuster's (`None` with `--meta off`)
    member: ClusterMember | JaxProcess | None = None  # a multi-worker run's part, else None
    probe_model: keras.Model | None = None  # a multi-worker run's network outside the strategy, for the probe
    clock: PhaseClock = dataclasses.field(default_factory=PhaseClock)  # the seconds of each phase
    lock: RunLock | None = None  # the lock on the directory (None in a worker that is not the chief)

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.release()

    def release(self):
        """Gives the run directory up: another `kadapt train` may take it."""
        if self.lock is not None:
            self.lock.release()

    def scope(self):
        """Where the network that trains is built: the strategy's scope in a
        TensorFlow multi-worker run (else a no-op)."""
        return _in_strategy(self.member)

    def local(self):
        """Where this worker computes alone (the probe, the meta-model, the test
        scores): outside a JAX run's distribution (else a no-op)."""
        return _alone(self.member)


def _in_strategy(member):
    return member.scope() if member else contextlib.nullcontext()


def _alone(member):
    return member.local() if member else contextlib.nullcontext()


def start_run(options, out, overwrite=False, resume=False, member=None, clock=None):
    """Takes the output directory, validates the options, data, network and
    directory, then creates it. Raises `UsageError` before writing anything
    (and leaves no directory it made).

    The returned `Run` holds the directory (`RunDirectory.claim`): until
    `Run.release` (or the end of a `with` block on it, or of the process),
    another `kadapt train` on it is refused.

    With `member` (a multi-worker run), the network is built under its
    strategy (on JAX: the distribution), and a worker that is not the chief
    writes into a scratch directory instead of `out`. `clock` (a
    `kadapt.run.phases.PhaseClock`, a new one by default) times the phases
    from here on."""
    directory = RunDirectory(out)
    if member is not None and not member.is_chief:
        lock, replace = None, directory.check_new_run(overwrite, resume)  # the chief holds `out`
    else:
        lock, replace = directory.claim(overwrite, resume)
    try:
        return _prepare(options, directory, replace, resume, member, PhaseClock() if clock is None else clock, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _prepare(options, directory, replace, resume, member, clock, lock):
    """`start_run`'s `Run`, in `directory`, which this process holds."""
    out = directory.path
    config = resolve_config(options, directory.read_json(files.CONFIG)["options"] if resume else None)
    if member is not None and not member.is_chief:
        directory, replace = RunDirectory(member.scratch_directory(out, resume)), True
    with clock.phase("data"):
        data = load_data(config)
    if member is not None and data.streamed:
        raise UsageError(f"--data {config.data} is streamed from disk, which --workers does not do yet: train "
                         "it in one process, or pass --stream off where it fits in memory.")
    recorded = (directory.read_json(files.CONFIG) or {}).get("resolved", {}) if resume else None
    plan = plan_training(config, data, recorded, member.workers if member else None)
    if member is not None and member.process_share is not None:
        _check_last_batch(plan, data, member.workers)
    with clock.phase("network"):
        precision = plan.precision or _measured_precision(plan, data)
        model, probe_model = _networks(plan, data, precision, member)
    directory.check_space(_run_bytes(model))
    with _alone(member):
        loaded = meta_model(plan.config)
    if not (resume and member is not None and not member.is_chief):
        directory.create(replace)
    return Run(plan, directory, data, model, precision, resume, loaded, member, probe_model, clock, lock)


def _networks(plan, data, precision, member):
    """`(network that trains, its twin outside the strategy for the probe or None)`.

    Variables made under the strategy draw other initial values than the same seed
    gives one process; a multi-worker run's workers start from the one-process
    network's weights instead, and that network is the one the probe's trial steps train."""
    keras.utils.set_random_seed(plan.config.seed)
    with _alone(member), global_policy(precision.policy):
        model = build_network(plan.network, data, plan.recipe)
    if member is None:
        return model, None
    with _in_strategy(member), global_policy(precision.policy):
        twin = build_network(plan.network, data, plan.recipe)
    twin.set_weights(model.get_weights())
    return twin, model


def _run_bytes(model):
    """About the bytes a run of `model` writes: `RUN_COPIES` float32 copies of its weights, and the logs and plots."""
    return RUN_COPIES * 4 * model.count_params() + LOG_BYTES


def _measured_precision(plan, data):
    """`--precision auto` in one process: the `PrecisionChoice` timed on the plan's network."""
    def build():
        return training.compile_recipe(build_network(plan.network, data, plan.recipe), plan.recipe, total_steps=1,
                                       task=data.task)

    return training.recipe_precision(plan.recipe, build, data.x_train, data.num_classes, plan.config.batch_size,
                                     network=plan.network)


def _check_last_batch(plan, data, workers):
    """Where each worker feeds an equal part of every batch (JAX), the last batch of an
    epoch must split too: the training rows must be a multiple of the workers (the
    batch is), which only the rows can fix."""
    config, expand = plan.config, plan.recipe.expand
    rows = _training_rows(len(data.x_train), expand)
    if rows % workers == 0:
        return
    fit = next((n for n in range(len(data.x_train) + len(data.x_val), 0, -1)
                if _training_rows(n - int(n * config.validation_split), expand) % workers == 0), None)
    example = (f", e.g. with --train-rows {fit} (the rows before --validation-split {config.validation_split})"
               if fit else "")
    raise UsageError(
        f"--workers {workers} feeds each worker an equal part of every batch, and the {rows} training rows leave "
        f"a last batch of {rows % config.batch_size} rows at --batch-size {config.batch_size}, not a multiple of "
        f"{workers}: make the training rows a multiple of {workers}{example}.")


def _training_rows(rows, expand):
    """Rows an epoch trains: `rows` and, with `--expand`, the generated ones (`kadapt.augment.expand`'s count)."""
    return rows + (round(expand * rows) if expand else 0)


def train(run, echo=print, callbacks=(), verbose=1):
    """Trains `run` (from `start_run`) and returns its `run.json` record.

    `callbacks` (Keras callbacks) run after kadapt's own, e.g. to measure
    something at every epoch end. `verbose` is `Model.fit`'s: 1 a progress
    bar, 2 one line per epoch (for logs and pipes), 0 nothing."""
    started = time.time()
    plan, directory, data, clock = run.plan, run.directory, run.data, run.clock
    with clock.phase("pipeline"):
        rows = training.expanded(data.x_train, data.train_targets, plan.recipe, data.num_classes, plan.config.seed)
        steps = {"train_rows": len(rows[0]),
                 **dict(zip(("steps_per_epoch", "total_steps"), schedule_steps(plan.config, len(rows[0]))))}
        with run.scope():
            training.compile_recipe(run.model, plan.recipe, steps["total_steps"], data.task)
    for note in data.notes:
        echo(f"data: {note}")
    if data.images:
        echo(images_text(data.images))
    echo(f"precision: {run.precision.policy} ({run.precision.reason})")
    echo(f"optimizer: {plan.optimizer.text()}")
    fallback = training.muon_fallback(run.model)
    if fallback:
        echo(f"optimizer: {fallback}")
    network = network_text(run.model)
    if network:
        echo(f"network: {network}")
    resolved = {**steps, "optimizer": plan.optimizer.to_dict(), "model": plan.network,
                **({"network": network} if network else {}), "data": data.summary(),
                "precision": run.precision.to_dict(), **plan.record()}
    _write_config(directory, plan.config, resolved)
    directory.update_run(status="probing", started_at=_now(), resumed=run.resume)
    try:
        with clock.phase("probe"):
            micro = _micro_batch_size(run, echo)
        with clock.phase("range test"):
            run.plan = _range_test(run, rows, steps, micro, echo)
        resolved.update(run.plan.record(), plan=_batch_plan(_share(run), micro))
        _write_config(directory, plan.config, resolved)
        with run.scope():
            trainer = _trainer(run, micro)
        directory.update_run(status="training", micro_batch_size=micro)
        first_step = FirstStepClock()
        with clock.fit(first_step):
            best = _fit(run, trainer, rows, steps, micro, [first_step, *callbacks], verbose)
    except KeyboardInterrupt:
        directory.update_run(status="interrupted", interrupted_at=_now())
        draw_plots(directory)
        raise
    except Exception as error:
        directory.update_run(status="failed", error=f"{type(error).__name__}: {error}")
        raise
    return _finish(run, trainer, best, started, echo)


def _range_test(run, rows, steps, micro, echo):
    """The run's plan, with `--learning-rate auto` at the rate the range test on
    the trainer finds (the network compiled again with it); `config.json`
    records it, and a resume reads the rate back (`plan_training`)."""
    config = run.plan.config
    batches = training.shuffled_batches(*rows, config.batch_size, run.data.num_classes, config.seed)
    _, result = training.with_found_learning_rate(
        run.plan.recipe, run.model, steps["total_steps"], batches, lambda: _trainer(run, micro), config.seed,
        run.data.task)
    if result is None:
        return run.plan
    echo(f"range test: learning rate {result.suggestion:.4g} ({result.rule}, {result.steps_run} steps"
         f"{', stopped at divergence' if result.diverged else ''})")
    return run.plan.with_found_rate({"learning_rate": result.suggestion, "rule": result.rule,
                                     "steps_run": result.steps_run, "diverged": result.diverged})


def _write_config(directory, config, resolved):
    """`config.json`: the options as given or defaulted, and what they resolved to."""
    directory.write_json(files.CONFIG, {"options": config.to_dict(), "resolved": resolved})


def _micro_batch_size(run, echo):
    """The probed micro-batch (the saved probe's on a resume); writes probe.json and probe.png."""
    saved = run.directory.read_json(files.PROBE) if run.resume else None
    if saved is not None:
        echo(f"resuming with the probed micro-batch {saved['micro_batch_size']}")
        return saved["micro_batch_size"]
    skipped = _probe_skipped(run)
    if skipped is not None:
        echo(f"probe skipped: {skipped}")
        run.directory.write_json(files.PROBE, {"skipped": skipped, "micro_batch_size": _share(run)})
        echo(f"plan: {_batch_plan(_share(run), _share(run))['text']}")
        return _share(run)
    result = _probe(run, echo)
    micro = result.micro_batch_size
    if run.member is not None:
        micro = run.member.smallest(micro)  # every worker traces the same step
        echo(f"micro-batch {micro}: the smallest that fits on every one of the {run.member.workers} workers")
    micro = balanced_micro_batch(_share(run), micro)  # as many passes, none of them a sliver
    run.directory.write_json(files.PROBE, {**result.to_dict(), "probed_micro_batch_size": result.micro_batch_size,
                                           "micro_batch_size": micro})
    draw_plots(run.directory)
    echo(f"plan: {_batch_plan(_share(run), micro)['text']}")
    return micro


def _share(run):
    """The rows of a logical batch that this worker trains: all of them on one worker."""
    return run.plan.config.batch_size // (run.member.workers if run.member else 1)


def _probe_skipped(run):
    """Why the probe need not run (`kadapt.batching.trivial_fit`), or `None`: it runs
    with a `--memory-budget` (the user asked for the measured path) or several workers."""
    units = model_output_units(run.model)
    if run.plan.config.memory_budget is not None or run.member is not None or units is None:
        return None
    budget = _budget(None)
    bound = step_bytes_bound(run.model.count_params(), units, _share(run))
    if not trivially_fits(bound, budget.bytes):
        return None
    return (f"a step of the whole logical batch ({_share(run)} rows) needs at most {bound / 2**20:.2f} MiB, "
            f"under {SKIP_FRACTION:.0%} of the budget ({budget.bytes / 2**20:.0f} MiB on {budget.device})")


def _probe(run, echo):
    config, data = run.plan.config, run.data
    budget = _budget(config.memory_budget)
    check_probe_allocator(budget.device)
    echo(budget_line(run.plan.network, budget))
    model = run.model
    if run.member is not None:
        # The probe's trial steps run on this worker alone (their sizes may differ between
        # workers), on the twin of the network outside the strategy.
        with run.local():
            model = training.compile_recipe(run.probe_model, run.plan.recipe, 1, data.task)
    rows = slice(0, 2 * _share(run))
    sample = (data.x_train[rows], data.train_targets[rows])

    try:
        with run.local():
            return probe_micro_batch(
                model, sample, memory_budget=config.memory_budget,
                max_micro_batch_size=_share(run), on_trial=lambda trial: echo(trial_line(trial)),
            )
    except ValueError as error:  # the budget holds not even one row
        reason = " ".join(str(error).split()).replace("Argument `memory_budget` is", "it is")
        given = (f"--memory-budget {config.memory_budget}" if config.memory_budget is not None
                 else f"The default memory budget ({budget.bytes / 2**20:.0f} MiB, {budget.source})")
        raise UsageError(f"{given} is too small for this model: {reason}") from None


def _budget(memory_budget):
    """The probe's budget: on JAX the plan's (`plan_budget`: XLA's device, whose CPU reports no limit)."""
    if keras.backend.backend() == "jax":
        from kadapt.batching.jax.probe import plan_budget  # JAX is optional

        return plan_budget(memory_budget)
    return device_budget(memory_budget)


def _batch_plan(batch_size, micro):
    batches = plan_batch(batch_size, micro)
    return {**dataclasses.asdict(batches), "text": str(batches)}


def _trainer(run, micro):
    if run.member is not None:
        micro = run.member.trainer_micro_batch(micro)  # JAX: a micro-batch of the mesh counts global rows
    trainer = training.micro_batched(run.model, micro, memory_budget=run.plan.config.memory_budget)
    trainer(run.data.x_train[:1])  # BackupAndRestore restores into a built model
    return trainer


def _fit(run, trainer, rows, steps, micro, extra_callbacks, verbose):
    """Trains; returns the best-weights callback (`None` with `--restore-best off`).

    The training data is one stream of every epoch's batches, each epoch's
    order and each batch's augmentation a function of the seed and the
    epoch or batch index; a resumed run's stream starts at the checkpointed
    epoch, so it trains the batches the uninterrupted run would have."""
    config, data = run.plan.config, run.data
    validation, validation_batch_size = None, micro
    if data.streamed and len(data.x_val):  # rows on disk, read in order a micro-batch at a time
        validation, validation_batch_size = data.x_val.dataset(micro, data.val_targets), None
    elif len(data.x_val):
        validation = (data.x_val, data.val_targets)
    backup = run.directory / files.BACKUP
    first_epoch = InterruptSafeBackup.checkpointed_epoch(backup) if run.resume else 0
    batches = training.shuffled_batches(*rows, config.batch_size, data.num_classes, config.seed, epochs=config.epochs,
                                      first_epoch=first_epoch)
    arranged = []

    def arrange(schedule_callbacks, best):
        arranged.extend(training_callbacks(run, steps, schedule_callbacks, best, first_epoch))
        arranged[-1:-1] = extra_callbacks  # the backup's committer stays last
        return arranged

    try:
        _, best = training.fit_recipe(
            trainer, batches, run.plan.recipe, epochs=config.epochs, steps_per_epoch=steps["steps_per_epoch"],
            total_steps=steps["total_steps"], arrange_callbacks=arrange, validation_data=validation,
            seed=config.seed, first_epoch=first_epoch, backup_dir=backup, verbose=verbose,
            share=run.member.process_share if run.member else None, validation_batch_size=validation_batch_size)
    finally:
        for callback in arranged:
            if hasattr(callback, "close"):
                callback.close()
    return best


def _finish(run, trainer, best, started, echo):
    directory, data, clock = run.directory, run.data, run.clock
    with clock.phase("evaluation"), run.local():
        # Each worker scores the whole test set (on JAX, a copy of the network outside the distribution)
        network = run.member.local_copy(run.model) if run.member else run.model
        scores = training.evaluate_recipe(network, data.x_test, data.y_test, run.plan.recipe, data.task)
    with clock.phase("saving"):
        _save_model(run)
    history = directory.read_json(files.HISTORY, {})
    record = {
        "status": "completed", "finished_at": _now(),
        "epochs_completed": len(history.get("epoch", [])),
        "steps_completed": int(trainer.optimizer.iterations.numpy()),
        "weights": _weights_record(best, history),
        **{f"test_{name}": value for name, value in scores.items()},
    }
    directory.update_run(**record)
    with clock.phase("saving"):
        plots = draw_plots(directory)  # they read run.json's scores
    record.update(wall_seconds=round(time.time() - started, 1), seconds=clock.to_dict())
    directory.update_run(wall_seconds=record["wall_seconds"], seconds=record["seconds"])
    echo(f"{scores_text(record)} after {record['steps_completed']} steps, {record['wall_seconds']:.0f} s; "
         f"weights of {record['weights']['text']}")
    decisions = directory.read_jsonl(files.META_DECISIONS)
    if run.meta_model is not None or decisions:  # with --meta off, the dead-run rescue's
        echo(_decisions_text(decisions))
    echo(clock.text())
    echo(f"run directory {directory.path}; plots: {', '.join(str(p) for p in plots)}")
    return directory.read_json(files.RUN)


def _save_model(run):
    """`model.keras`: raw rows -> the adapted encoder -> the network (-> the
    target's units), of Keras' own classes (`kadapt.portable_model`: plain Keras
    loads it); `training.keras`, the network as it trains (the rows as the
    network takes them), compiled with kadapt's optimizer in its state at the
    end (`kadapt.load_model(RUN, for_training=True)`); and `classes.json`, the
    class names, for string labels."""
    from kadapt.run.encoding import inference_model
    from kadapt.saving import portable_model

    data = run.data
    with run.local():  # on JAX, Keras' saving makes variables: under the distribution with collectives
        model = inference_model(data.encoder, run.model, data.task)
        if data.images:  # files' pixels of any size -> resized, scaled (kadapt.run.image_folders)
            model = raw_image_model(model, ImageSize.from_record(data.images))
        with whole_file(run.directory / files.MODEL) as temporary:
            portable_model(model).save(temporary)
        with whole_file(run.directory / files.TRAINING_MODEL) as temporary:
            run.model.save(temporary)  # compiled: kadapt's optimizer, its schedule and state, the run's loss
    if data.class_names:
        run.directory.write_json(files.CLASSES, list(data.class_names))


def _decisions_text(decisions):
    if not decisions:
        return "MetaAdjuster: no decision (nothing called for one)"
    listed = "; ".join(f"step {d['step']} {d['trigger']} -> {d['action']}" for d in decisions)
    return f"decisions (MetaAdjuster, dead-run rescue): {len(decisions)}: {listed}"


def _weights_record(best, history):
    """Which epoch's weights `model.keras` holds (1-based, as Keras prints epochs)."""
    last = len(history.get("epoch", []))
    if best is None or best.best_weights is None:
        return {"epoch": last, "restored": False, "text": f"the last epoch ({last})"}
    epoch = best.best_epoch + 1
    return {"epoch": epoch, "restored": True, "monitor": best.monitor, "value": float(best.best),
            "text": f"epoch {epoch}, the best {best.monitor} ({float(best.best):.4f})"}


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
