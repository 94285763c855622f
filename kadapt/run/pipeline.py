"""The `kadapt train` job: the recipe of `kadapt.recipes` (network,
schedule, augmentation, label smoothing, test-time augmentation) with
probe -> plan -> accumulate, the MetaAdjuster, evaluation and save, in a run
directory.

`start_run` checks everything the user gave before it writes anything;
`train` then runs the job in the run directory. An interrupt (Ctrl-C) leaves
the directory consistent: config, the epochs that finished, the steps
logged, `run.json` with status "interrupted" and the `BackupAndRestore`
state that `--resume` continues from.
"""

import contextlib
import dataclasses
import time

import keras

from kadapt.batching import balanced_micro_batch
from kadapt.batching import plan_batch
from kadapt.batching import probe_micro_batch
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.trivial_fit import SKIP_FRACTION
from kadapt.batching.trivial_fit import model_output_units
from kadapt.batching.trivial_fit import step_bytes_bound
from kadapt.batching.trivial_fit import trivially_fits
from kadapt.precision import PrecisionChoice
from kadapt.precision import global_policy
from kadapt.precision import pinned_precision
from kadapt.recipes import training as recipe
from kadapt.recipes.config import AUTO
from kadapt.run import run_directory as files
from kadapt.run.backup import InterruptSafeBackup
from kadapt.run.callbacks import meta_model
from kadapt.run.callbacks import training_callbacks
from kadapt.run.config import resolve_config
from kadapt.run.config import schedule_steps
from kadapt.run.config import with_batch_size
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
from kadapt.run.recipe_options import augmentation_text
from kadapt.run.recipe_options import network_name
from kadapt.run.recipe_options import optimizer_choice
from kadapt.run.recipe_options import recipe_config
from kadapt.run.report import scores_text
from kadapt.run.run_directory import RunDirectory
from kadapt.run.run_directory import whole_file

# model.keras and its temporary copy, the backup's checkpoint and its previous one, each with the
# optimizer's slots (Adam: two per weight), and the best epoch's weights.
RUN_COPIES = 9
LOG_BYTES = 2**20


@dataclasses.dataclass
class Run:
    """What `start_run` prepared: the config, its recipe, directory, data,
    network (and its name) and meta-model (`None` with `--meta off`)."""

    config: object
    recipe: object
    directory: RunDirectory
    data: object
    model_name: str
    model: object
    meta_model: object
    resume: bool
    member: object = None  # a multi-worker run's `ClusterMember` (TensorFlow) or `JaxProcess`, else None
    probe_model: object = None  # a multi-worker run's network outside the strategy, for the probe
    precision: object = None  # the `kadapt.precision.PrecisionChoice` the network was built under
    range_test: dict | None = None  # with --learning-rate auto, what config.json records of the range test
    clock: PhaseClock = dataclasses.field(default_factory=PhaseClock)  # the seconds of each phase
    lock: object = None  # the `kadapt.run.run_lock.RunLock` on the directory (None in a worker that is not the chief)

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
        return self.member.scope() if self.member else contextlib.nullcontext()

    def local(self):
        """Where this worker computes alone (the probe, the meta-model, the test
        scores): outside a JAX run's distribution (else a no-op)."""
        return self.member.local() if self.member else contextlib.nullcontext()


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
        run = _prepare(options, directory, replace, resume, member, clock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    run.lock = lock
    return run


def _prepare(options, directory, replace, resume, member, clock):
    """`start_run`'s `Run`, in `directory`, which this process holds."""
    out = directory.path
    clock = PhaseClock() if clock is None else clock
    saved = directory.read_json(files.CONFIG)["options"] if resume else None
    config = resolve_config(options, saved)
    if member is not None and not member.is_chief:
        directory, replace = RunDirectory(member.scratch_directory(out, resume)), True
    with clock.phase("data"):
        data = load_data(config)
    config = with_batch_size(config, len(data.x_train))
    if member is not None:
        _check_split(config.batch_size, member.workers)
        if data.streamed:
            raise UsageError(f"--data {config.data} is streamed from disk, which --workers does not do yet: train "
                             "it in one process, or pass --stream off where it fits in memory.")
    settings, found = _found_rate(recipe_config(config, data), directory if resume else None, member)
    if member is not None and member.process_share is not None:
        _check_last_batch(config, settings, data, member.workers)
    name = network_name(config, data)
    with clock.phase("network"):
        precision = _precision(config, settings, name, data, directory if resume else None, member)
        run = Run(config, settings, directory, data, name, None, None, resume, member, precision=precision,
                  range_test=found, clock=clock)
        keras.utils.set_random_seed(config.seed)
        with run.local(), global_policy(precision.policy):
            run.model = build_network(name, data, settings)
    directory.check_space(_run_bytes(run.model))
    if member is not None:
        # Variables made under the strategy draw other initial values than the same seed gives
        # one process; the workers start from the one-process network's weights instead. That
        # network (outside the strategy) is also the one the probe's trial steps train.
        run.probe_model = run.model
        with run.scope(), global_policy(precision.policy):
            run.model = build_network(name, data, settings)
        run.model.set_weights(run.probe_model.get_weights())
    with run.local():
        run.meta_model = meta_model(config)
    if not (resume and member is not None and not member.is_chief):
        directory.create(replace)
    return run


def _run_bytes(model):
    """About the bytes a run of `model` writes: `RUN_COPIES` float32 copies of its weights, and the logs and plots."""
    return RUN_COPIES * 4 * model.count_params() + LOG_BYTES


def _precision(config, settings, name, data, resumed, member):
    """The recipe's `PrecisionChoice` (`--precision`); a resumed run keeps the one it recorded."""
    recorded = (resumed.read_json(files.CONFIG) or {}).get("resolved", {}).get("precision") if resumed else None
    if recorded:
        return PrecisionChoice(**recorded)
    if member is not None and settings.precision == "auto":  # timed in each worker, they could choose apart
        return pinned_precision() or PrecisionChoice("float32", {}, (
            "--precision auto measures in one process, and the workers could choose differently: float32 "
            "(pass --precision bfloat16 or float16 for 16-bit steps)"))

    def build():
        return recipe.compile_recipe(build_network(name, data, settings), settings, total_steps=1, task=data.task)

    return recipe.recipe_precision(settings, build, data.x_train, data.num_classes, config.batch_size, network=name)


def _found_rate(settings, resumed, member):
    """`(recipe, range test record)`; with `--learning-rate auto`, a resumed run
    takes the rate its range test found (the record is `None` where none ran yet)."""
    if settings.learning_rate != AUTO:
        return settings, None
    if member is not None:
        raise UsageError("--learning-rate auto runs a range test in each worker, and the workers could find "
                         "different rates: find one with `kadapt find-lr` and pass it as --learning-rate.")
    found = (resumed.read_json(files.CONFIG) or {}).get("resolved", {}).get("range_test") if resumed else None
    return (settings.replace(learning_rate=found["learning_rate"]), found) if found else (settings, None)


def _check_split(batch_size, workers):
    if batch_size % workers:
        raise UsageError(f"--batch-size {batch_size} is the global batch of {workers} workers: use a "
                         f"multiple of {workers}, e.g. {batch_size - batch_size % workers or workers}.")


def _check_last_batch(config, settings, data, workers):
    """Where each worker feeds an equal part of every batch (JAX), the last batch of an
    epoch must split too: the training rows must be a multiple of the workers (the
    batch is), which only the rows can fix."""
    rows = _training_rows(len(data.x_train), settings.expand)
    if rows % workers == 0:
        return
    fit = next((n for n in range(len(data.x_train) + len(data.x_val), 0, -1)
                if _training_rows(n - int(n * config.validation_split), settings.expand) % workers == 0), None)
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
    config, directory, data, clock = run.config, run.directory, run.data, run.clock
    with clock.phase("pipeline"):
        rows = recipe.expanded(data.x_train, data.train_targets, run.recipe, data.num_classes, config.seed)
        steps = {"train_rows": len(rows[0]),
                 **dict(zip(("steps_per_epoch", "total_steps"), schedule_steps(config, len(rows[0]))))}
        with run.scope():
            recipe.compile_recipe(run.model, run.recipe, steps["total_steps"], data.task)
    for note in data.notes:
        echo(f"data: {note}")
    if data.images:
        echo(images_text(data.images))
    echo(f"precision: {run.precision.policy} ({run.precision.reason})")
    choice = optimizer_choice(config, data)
    echo(f"optimizer: {choice.optimizer}, learning rate {choice.learning_rate}, {choice.schedule} schedule "
         f"({choice.reason})")
    resolved = {**steps, "optimizer": choice.to_dict(), "model": run.model_name, "data": data.summary(),
                "precision": run.precision.to_dict(), "augmentation": augmentation_text(run.recipe),
                "recipe": dataclasses.asdict(run.recipe), "test_time_augmentation": run.recipe.test_time_augmentation,
                **({"range_test": run.range_test} if run.range_test else {})}
    _write_config(directory, config, resolved)
    directory.update_run(status="probing", started_at=_now(), resumed=run.resume)
    try:
        with clock.phase("probe"):
            micro = _micro_batch_size(run, echo)
        with clock.phase("range test"):
            resolved.update(_range_test(run, rows, steps, micro, echo))
        _write_config(directory, config, {**resolved, "plan": _plan(_share(run), micro)})
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
    """With `--learning-rate auto`: the range test on the trainer, its rate
    into `run.recipe` (the network compiled again with it); returns what
    `config.json` records of it (a resume reads the rate back)."""
    batches = recipe.shuffled_batches(*rows, run.config.batch_size, run.data.num_classes, run.config.seed)
    run.recipe, result = recipe.with_found_learning_rate(
        run.recipe, run.model, steps["total_steps"], batches, lambda: _trainer(run, micro), run.config.seed,
        run.data.task)
    if result is None:
        return {}
    echo(f"range test: learning rate {result.suggestion:.4g} ({result.rule}, {result.steps_run} steps"
         f"{', stopped at divergence' if result.diverged else ''})")
    run.range_test = {"learning_rate": result.suggestion, "rule": result.rule, "steps_run": result.steps_run,
                      "diverged": result.diverged}
    return {"recipe": dataclasses.asdict(run.recipe), "range_test": run.range_test}


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
        echo(f"plan: {_plan(_share(run), _share(run))['text']}")
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
    echo(f"plan: {_plan(_share(run), micro)['text']}")
    return micro


def _share(run):
    """The rows of a logical batch that this worker trains: all of them on one worker."""
    return run.config.batch_size // (run.member.workers if run.member else 1)


def _probe_skipped(run):
    """Why the probe need not run (`kadapt.batching.trivial_fit`), or `None`: it runs
    with a `--memory-budget` (the user asked for the measured path) or several workers."""
    units = model_output_units(run.model)
    if run.config.memory_budget is not None or run.member is not None or units is None:
        return None
    budget = _budget(None)
    bound = step_bytes_bound(run.model.count_params(), units, _share(run))
    if not trivially_fits(bound, budget.bytes):
        return None
    return (f"a step of the whole logical batch ({_share(run)} rows) needs at most {bound / 2**20:.2f} MiB, "
            f"under {SKIP_FRACTION:.0%} of the budget ({budget.bytes / 2**20:.0f} MiB on {budget.device})")


def _probe(run, echo):
    config, data = run.config, run.data
    budget = _budget(config.memory_budget)
    check_probe_allocator(budget.device)
    echo(budget_line(run.model_name, budget))
    model = run.model
    if run.member is not None:
        # The probe's trial steps run on this worker alone (their sizes may differ between
        # workers), on the twin of the network outside the strategy.
        with run.local():
            model = recipe.compile_recipe(run.probe_model, run.recipe, 1, data.task)
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


def _plan(batch_size, micro):
    plan = plan_batch(batch_size, micro)
    return {**dataclasses.asdict(plan), "text": str(plan)}


def _trainer(run, micro):
    if run.member is not None:
        micro = run.member.trainer_micro_batch(micro)  # JAX: a micro-batch of the mesh counts global rows
    trainer = recipe.micro_batched(run.model, micro, memory_budget=run.config.memory_budget)
    trainer(run.data.x_train[:1])  # BackupAndRestore restores into a built model
    return trainer


def _fit(run, trainer, rows, steps, micro, extra_callbacks, verbose):
    """Trains; returns the best-weights callback (`None` with `--restore-best off`).

    The training data is one stream of every epoch's batches, each epoch's
    order and each batch's augmentation a function of the seed and the
    epoch or batch index; a resumed run's stream starts at the checkpointed
    epoch, so it trains the batches the uninterrupted run would have."""
    config, data = run.config, run.data
    validation, validation_batch_size = None, micro
    if data.streamed and len(data.x_val):  # rows on disk, read in order a micro-batch at a time
        validation, validation_batch_size = data.x_val.dataset(micro, data.val_targets), None
    elif len(data.x_val):
        validation = (data.x_val, data.val_targets)
    backup = run.directory / files.BACKUP
    first_epoch = InterruptSafeBackup.checkpointed_epoch(backup) if run.resume else 0
    batches = recipe.shuffled_batches(*rows, config.batch_size, data.num_classes, config.seed, epochs=config.epochs,
                                      first_epoch=first_epoch)
    arranged = []

    def arrange(schedule_callbacks, best):
        arranged.extend(training_callbacks(run, steps, schedule_callbacks, best, first_epoch))
        arranged[-1:-1] = extra_callbacks  # the backup's committer stays last
        return arranged

    try:
        _, best = recipe.fit_recipe(
            trainer, batches, run.recipe, epochs=config.epochs, steps_per_epoch=steps["steps_per_epoch"],
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
        scores = recipe.evaluate_recipe(network, data.x_test, data.y_test, run.recipe, data.task)
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
