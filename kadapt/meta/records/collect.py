"""Collects adjustment records by branching lookahead.

Each task trains along a main line, observed at every epoch end as
`MetaAdjuster` observes a `fit` (training loss averaged over the epoch,
validation loss after it). At every decision point the collector snapshots the
weights and the optimizer, tries each candidate action of
`kadapt.meta.actions.ACTIONS` on the same batches (common random numbers make
the candidates comparable), stores one record per candidate and restores.

A branch is scored at the end of the task's budget: after the action it trains
on, keeping everything (a schedule goes on decaying), to the last step. A short
horizon favours whatever lowers the loss soonest — a large cut of a rate that
is merely high — which the end of the run does not reward (the short-horizon
bias); the score after `horizon_epochs` is stored beside it (`score_short`) so
the two can be compared. The main line then continues from the state
`horizon_epochs` into the best candidate's branch (or, with probability
`explore`, into "keep"'s), so later windows also show runs that have been
adjusted — as they will be in use. When an observation is non-finite, the
decision point comes at once and every branch starts from the last good state:
the meta-model learns what to do after a rollback, which is what
`MetaAdjuster` does on divergence.

Two tasks in three start with a learning-rate range test from the initial
state (`RangeTestStart`'s, seeded; the state is put back, the rate is not
moved): its suggestion is a feature of every later observation
(`range_test_gap`), so the records hold runs with and without a suggestion and
show when following it pays.

The score of a candidate is log(val_loss at the end / val_loss before),
clipped to [-5, 5]; a diverged branch scores 5. Lower is better.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import multiprocessing
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable

from typing import TYPE_CHECKING

import keras
import numpy as np

from kadapt import environment
from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.adjustment_record import AdjustmentRecord
from kadapt.meta.model.features import FeatureHistory
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.observe.observation import observe_model
from kadapt.meta.start.range_test_start import RangeTestStart
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum
from kadapt.validation import checked_lease

if TYPE_CHECKING:
    from kadapt.meta.records.record_store import RecordStore
    from kadapt.meta.records.tasks import Task

DIVERGED_SCORE = 5.0
RANGE_TEST_SHARE = 2 / 3  # of the tasks start with a range test; the rest show runs without one
_TINY_LOSS = 1e-8  # a validation loss can reach 0.0 in float32 on an easy task


@dataclasses.dataclass(frozen=True)
class CollectionConfig:
    """How a task is run and branched.

    Args:
        total_epochs: Int. The task's budget: its main line's length, and the
            span of its schedule. Defaults to `12`.
        horizon_epochs: Int. The spacing of decision points (the first comes
            after 2 epochs; the last leaves a full horizon before the end) and
            the short score's horizon. Defaults to `3`.
        explore: Float in [0, 1]. Probability of continuing with "keep"
            instead of the best candidate. Defaults to `0.3`.
    """

    total_epochs: int = 12
    horizon_epochs: int = 3
    explore: float = 0.3


LEASE_SECONDS = 120.0  # a dead collector's task is taken over this long after its last heartbeat
POLL_SECONDS = 1.0  # how often a collector with nothing to claim, or a progress bar, looks again


def collect(store: RecordStore, tasks: Iterable[Task], config: CollectionConfig = CollectionConfig(), seed: int = 0,
            progress: bool = True, *, workers: int = 1, lease_seconds: float = LEASE_SECONDS) -> int:
    """Runs `tasks`, branching at decision points, and appends records to `store`.

    Tasks are claimed through the store, so collectors in other processes and
    on other hosts that point at the same store (a PostgreSQL URL) and the same
    task list share the work: each task is collected exactly once. A claim is a
    lease that a running collector renews; when a collector dies, its task is
    taken over once the lease has run out. A task's records are appended in
    one transaction when it ends, and finished tasks are skipped, so an
    interrupted collection resumes where it stopped. A task's exploration seed
    is `(seed, its index in tasks)`, whoever runs it.

    Args:
        store: `kadapt.meta.RecordStore`.
        tasks: Iterable of `kadapt.meta.tasks.Task`, with distinct names.
        config: `CollectionConfig`.
        seed: Int. Seeds the exploration choices.
        progress: Bool. Shows a Keras progress bar of the tasks finished by
            all collectors. Defaults to `True`.
        workers: Int. Collector processes to start on this host; `1` collects
            in this process. Each gets an equal share of the CPU threads.
            Defaults to `1`.
        lease_seconds: Float. How long a claim holds without renewal.
            Defaults to `LEASE_SECONDS`.

    Returns:
        The number of records appended by this call's collectors.

    Example:

    ```python
    from kadapt.meta import RecordStore, collect, tasks
    store = RecordStore("postgresql://kadapt@db-host:5432/records")
    collect(store, [tasks.make_task("digits", seed) for seed in range(10)], workers=2)
    ```
    """
    tasks = list(tasks)
    _check_collect_arguments(tasks, workers, lease_seconds)
    names = [task.name for task in tasks]
    bar = _TaskProgress(store, names) if progress else None
    if workers == 1 or len(store.finished_tasks(names)) == len(names):
        return Collector(store, tasks, config, seed, lease_seconds).run(bar)
    return _collect_in_processes(store, tasks, config, seed, lease_seconds, workers, bar)


def _check_collect_arguments(tasks, workers, lease_seconds):
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"Argument `workers` must be a positive int. Received: workers={workers!r}")
    checked_lease(lease_seconds)
    names = [task.name for task in tasks]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"Argument `tasks` must have distinct names; repeated: {repeated[:3]}. "
                         "Make each task once (a name says family, model, optimizer, rate and seed).")


class Collector:
    """One collector: claims a task, runs it, stores it, until every task is finished."""

    def __init__(self, store, tasks, config, seed, lease_seconds):
        self.store, self.tasks, self.config, self.seed = store, tasks, config, seed
        self.lease_seconds = lease_seconds
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.index = {task.name: index for index, task in enumerate(tasks)}

    def run(self, bar=None):
        names = list(self.index)
        appended = 0
        with _Heartbeat(self.store, self.owner, self.lease_seconds):
            while True:
                name = self.store.claim_task(names, self.owner, self.lease_seconds)
                if name is None:
                    if len(self.store.finished_tasks(names)) == len(names):
                        break
                    time.sleep(POLL_SECONDS)  # the rest is held by live collectors, or leased by dead ones
                    continue
                index = self.index[name]
                records = TaskRun(self.tasks[index], self.config, np.random.default_rng([self.seed, index])).run()
                appended += self.store.finish_task(name, self.owner, records)
                if bar is not None:
                    bar.update()
        if bar is not None:
            bar.update(final=True)
        return appended


class _Heartbeat:
    """Renews a collector's leases every third of a lease, in a thread, while the context lasts."""

    def __init__(self, store, owner, lease_seconds):
        self.store, self.owner, self.lease_seconds = store, owner, lease_seconds
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="kadapt-lease", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stop.set()
        self.thread.join()

    def _beat(self):
        while not self.stop.wait(self.lease_seconds / 3):
            self.store.renew_claims(self.owner, self.lease_seconds)


class _TaskProgress:
    """A Keras progress bar of the tasks finished by all collectors of `names`."""

    def __init__(self, store, names):
        self.store, self.names = store, names
        self.bar = keras.utils.Progbar(len(names), unit_name="task", stateful_metrics=["records"])
        self.shown, self.finalized = None, False

    def update(self, final=False):
        done = len(self.store.finished_tasks(self.names))
        final = final or done == len(self.names)
        if self.finalized or (done == self.shown and not final):
            return
        self.bar.update(done, values=[("records", self.store.count())], finalize=final)
        self.shown, self.finalized = done, final


def _collect_in_processes(store, tasks, config, seed, lease_seconds, workers, bar):
    """Starts `workers` collector processes, follows their progress, returns their appended count."""
    context = multiprocessing.get_context("spawn")  # a forked child would share TensorFlow's threads
    results = context.Queue()
    threads = environment.thread_share(workers)
    processes = [context.Process(target=_collector_process, name=f"kadapt-collector-{number}",
                                 args=(store, tasks, config, seed, lease_seconds, threads, results))
                 for number in range(workers)]
    for process in processes:
        process.start()
    try:
        while any(process.is_alive() for process in processes):
            if bar is not None:
                bar.update()
            for process in processes:
                process.join(POLL_SECONDS / len(processes))
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
    appended = sum(results.get() for process in processes if process.exitcode == 0)
    failed = [f"{process.name} (exit code {process.exitcode})" for process in processes if process.exitcode != 0]
    if bar is not None:
        bar.update(final=True)
    if failed:
        missing = len(tasks) - len(store.finished_tasks([task.name for task in tasks]))
        raise RuntimeError(f"Collectors failed: {', '.join(failed)}; {missing} of {len(tasks)} tasks are not "
                           f"collected. Run the same collection again to finish them (finished tasks are skipped).")
    return appended


def _collector_process(store, tasks, config, seed, lease_seconds, threads, results):
    environment.set_cpu_threads(threads)
    results.put(Collector(store, tasks, config, seed, lease_seconds).run())


class TaskRun:
    """One task's main line with its branches."""

    def __init__(self, task, config, rng):
        self.task, self.config, self.rng = task, config, rng
        self.batches = BatchStream(task.data[0], task.data[1], task.batch_size, task.seed)
        self.observe_every = self.batches.batches_per_epoch
        self.horizon = config.horizon_epochs * self.observe_every
        self.total_steps = config.total_epochs * self.observe_every
        self.model = task.build(self.total_steps)
        self.history = FeatureHistory()
        self.range_test_rate = None
        self.step = 0
        self.last_good = None
        self.records = []

    def run(self):
        x_val, y_val = self.task.data[2], self.task.data[3]
        if self.rng.random() < RANGE_TEST_SHARE:
            self.range_test_rate = self.range_test()
        initial = float(self.model.evaluate(x_val, y_val, verbose=0))
        self.last_good = Snapshot.take(self.model, self.batches, 0, initial)
        self.train(self.observe_every * 2, self.history)
        while self.step + self.horizon <= self.total_steps and self.decide():
            pass
        return self.records

    def range_test(self):
        """The range test's suggestion from the initial state (left as it was); `None` without one."""
        start = RangeTestStart(self.task.data[0], self.task.data[1], self.task.batch_size, seed=self.task.seed,
                               judge="always")  # its test length, as the records have it; the rate is not moved
        num_steps = start.num_steps(self.total_steps)
        if num_steps is None:
            return None
        try:
            return float(start.run(self.model, num_steps).suggestion)
        except ValueError:  # a curve no rate can be read off
            return None

    def decide(self):
        """Branches once; returns whether the main line can go on."""
        rollback = self.history.window()[-1, FEATURE_NAMES.index("nonfinite")] > 0
        base = self.last_good if rollback else Snapshot.take(
            self.model, self.batches, self.step, self.history.last_val_loss)
        window, before = self.history.window(), base.val_loss
        allowed = action_lib.allowed_mask(self.model.optimizer, self.range_test_rate)
        branches = [self.branch(base, i) for i in np.flatnonzero(allowed)]
        for action_index, branch in branches:
            self.records.append(self.record(window, base, action_index, branch, before, rollback))
        chosen = self.choose(branches)
        if chosen is None:
            return False
        chosen["continue"].restore(self.batches)
        self.step, self.history = chosen["continue"].step, chosen["continue_history"]
        self.last_good = chosen["continue"]
        return True

    def branch(self, base, action_index):
        """Applies one action at `base` and trains to the end of the budget.

        Returns the action and the branch: its state and history after
        `horizon` steps (where the main line may continue), its validation
        losses there (`short_val_loss`) and at the end (`val_loss`; NaN when
        it diverged), and the hyperparameters before the action."""
        base.restore(self.batches)
        self.step = base.step
        hyperparameters = self.hyperparameters()
        action_lib.apply(self.model.optimizer, action_lib.ACTIONS[action_index], suggestion=self.range_test_rate)
        history = copy.deepcopy(self.history)
        branch = {"hyperparameters": hyperparameters, "continue": None, "continue_history": None,
                  "short_val_loss": math.nan, "val_loss": math.nan, "train_loss": math.nan}
        if not self.train(self.horizon, history):
            return action_index, branch
        branch.update({"continue": Snapshot.take(self.model, self.batches, self.step, history.last_val_loss),
                       "continue_history": copy.deepcopy(history), "short_val_loss": history.last_val_loss})
        if self.train(self.total_steps - self.step, history):
            branch.update({"val_loss": history.last_val_loss, "train_loss": history.last_loss})
        return action_index, branch

    def choose(self, branches):
        """The branch the main line follows: the lowest final validation loss (then the lowest
        short one), or with probability `explore` keep's; `None` when all diverged early."""
        alive = [(i, b) for i, b in branches if b["continue"] is not None]
        if not alive:
            return None
        keep = dict(alive).get(action_lib.KEEP)
        if keep is not None and self.rng.random() < self.config.explore:
            return keep
        return min(alive, key=lambda pair: (_or_inf(pair[1]["val_loss"]), pair[1]["short_val_loss"]))[1]

    def train(self, steps, history):
        """Trains `steps` steps, observing into `history`; False on non-finite."""
        losses = []
        for _ in range(steps):
            x, y = self.batches.next()
            losses.append(float(self.model.train_on_batch(x, y)))
            self.step += 1
            if self.step % self.observe_every == 0:
                if not self.observe(np.mean(losses), history):
                    return False
                losses = []
        return True

    def observe(self, loss, history):
        x_val, y_val = self.task.data[2], self.task.data[3]
        val_loss = float(self.model.test_on_batch(x_val, y_val))
        # The same observation as the MetaAdjuster's (kadapt.meta.observe.observation): trainable weights.
        observation = observe_model(self.model, self.step, float(loss), val_loss,
                                    min(self.step / self.total_steps, 1.0), self.total_steps, self.range_test_rate)
        history.observe(observation)
        finite = math.isfinite(loss) and math.isfinite(val_loss) and history.weights_finite
        if finite and history is self.history:
            self.last_good = Snapshot.take(self.model, self.batches, self.step, val_loss)
        return finite

    def hyperparameters(self):
        optimizer = self.model.optimizer
        return {"optimizer": self.task.optimizer, "batch_size": self.task.batch_size,
                "schedule": self.task.schedule, "architecture": self.task.architecture,
                "loss": self.task.loss, "learning_rate": applied_learning_rate(optimizer),
                "momentum": current_momentum(optimizer), "range_test_rate": self.range_test_rate}

    def record(self, window, base, action_index, branch, before, rollback):
        after, short = branch["val_loss"], branch["short_val_loss"]
        diverged = not math.isfinite(after)
        return AdjustmentRecord(
            run_id=self.task.name, task=self.task.name, family=self.task.family, step=base.step,
            features=window, hyperparameters=branch["hyperparameters"],
            adjustment={"action": int(action_index), **action_lib.ACTIONS[action_index],
                        "rollback": bool(rollback)},
            outcome={"val_loss_before": before, "val_loss_after": None if diverged else after,
                     "train_loss_after": None if diverged else branch["train_loss"],
                     "diverged": diverged, "horizon": self.total_steps - base.step,
                     "score": _score(after, before), "score_short": _score(short, before),
                     "short_horizon": self.horizon})


def _score(after, before):
    if not math.isfinite(after):
        return DIVERGED_SCORE
    return float(np.clip(math.log((after + _TINY_LOSS) / (before + _TINY_LOSS)), -5.0, 5.0))


def _or_inf(value):
    return value if math.isfinite(value) else math.inf


class BatchStream:
    """Shuffled mini-batches, reproducible from a position (epoch, index)."""

    def __init__(self, x, y, batch_size, seed):
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.batches_per_epoch = max(len(x) // batch_size, 1)
        self.position = 0

    def next(self):
        epoch, index = divmod(self.position, self.batches_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.x))
        rows = order[index * self.batch_size:(index + 1) * self.batch_size]
        self.position += 1
        return self.x[rows], self.y[rows]


@dataclasses.dataclass
class Snapshot:
    """The training state (`kadapt.batching.training_state`), batch position and step."""

    state: list
    position: int
    step: int
    val_loss: float = float("nan")

    @classmethod
    def take(cls, model, batches, step, val_loss=float("nan")):
        training_state = _training_state()
        return cls(training_state.snapshot(training_state.state_variables(model)),
                   batches.position, step, val_loss)

    def restore(self, batches):
        _training_state().restore(self.state)
        batches.position = self.position


def _training_state():
    # Imported on use: kadapt.batching loads the backend's train step, and `import kadapt.meta`
    # (the MetaAdjuster) must not need it.
    from kadapt.batching import training_state

    return training_state
