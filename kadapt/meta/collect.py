"""Collects adjustment records by branching lookahead.

Each task trains along a main line, observed at every epoch end as
`MetaAdjuster` observes a `fit` (training loss averaged over the epoch,
validation loss after it). At every decision point the collector snapshots the
weights and the optimizer, tries each candidate action of
`kadapt.meta.actions.ACTIONS` for `horizon_epochs` epochs on the same batches (common
random numbers make the candidates comparable), stores one record per
candidate and restores. The main line then continues from the end of the best
candidate's branch (or, with probability `explore`, of "keep"), so later
windows also show runs that have been adjusted — as they will be in use. When
an observation is non-finite, the decision point comes at once and every
branch starts from the last good state: the meta-model learns what to do after
a rollback, which is what `MetaAdjuster` does on divergence.

The score of a candidate is log(val_loss after / val_loss before), clipped to
[-5, 5]; a diverged branch scores 5. Lower is better.
"""

import copy
import dataclasses
import math

import keras
import numpy as np

from kadapt.batching import training_state
from kadapt.meta import actions as action_lib
from kadapt.meta.adjustment_record import AdjustmentRecord
from kadapt.meta.features import FeatureHistory
from kadapt.meta.features import Observation
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum

DIVERGED_SCORE = 5.0
_TINY_LOSS = 1e-8  # a validation loss can reach 0.0 in float32 on an easy task


@dataclasses.dataclass(frozen=True)
class CollectionConfig:
    """How a task is run and branched.

    Args:
        total_epochs: Int. Length of a task's main line. Defaults to `15`.
        horizon_epochs: Int. Epochs each candidate runs; also the spacing of
            decision points (the first comes after 2 epochs). Defaults to `3`.
        explore: Float in [0, 1]. Probability of continuing with "keep"
            instead of the best candidate. Defaults to `0.3`.
    """

    total_epochs: int = 15
    horizon_epochs: int = 3
    explore: float = 0.3


def collect(store, tasks, config=CollectionConfig(), seed=0, progress=True):
    """Runs `tasks`, branching at decision points, and appends records to `store`.

    A task's records are appended in one transaction when the task ends, and a
    task whose records are already in the store is skipped, so an interrupted
    collection resumes where it stopped without recomputing anything.

    Args:
        store: `kadapt.meta.RecordStore`.
        tasks: Iterable of `kadapt.meta.tasks.Task`.
        config: `CollectionConfig`.
        seed: Int. Seeds the exploration choices.
        progress: Bool. Shows a Keras progress bar. Defaults to `True`.

    Returns:
        The number of records appended.

    Example:

    ```python
    from kadapt.meta import RecordStore, collect, tasks
    store = RecordStore("records.sqlite")
    collect(store, [tasks.make_task("digits", seed) for seed in range(10)])
    ```
    """
    tasks = list(tasks)
    bar = keras.utils.Progbar(len(tasks), unit_name="task", stateful_metrics=["records"]) if progress else None
    appended = 0
    for index, task in enumerate(tasks):
        if not store.contains(task.name):
            records = TaskRun(task, config, np.random.default_rng([seed, index])).run()
            store.append_many(records)
            appended += len(records)
        if bar is not None:
            bar.update(index + 1, values=[("records", store.count())], finalize=index + 1 == len(tasks))
    return appended


class TaskRun:
    """One task's main line with its branches."""

    def __init__(self, task, config, rng):
        self.task, self.config, self.rng = task, config, rng
        self.model = task.build()
        self.batches = BatchStream(task.data[0], task.data[1], task.batch_size, task.seed)
        self.history = FeatureHistory()
        self.step = 0
        self.last_good = None
        self.records = []
        self.observe_every = self.batches.batches_per_epoch
        self.horizon = config.horizon_epochs * self.observe_every
        self.total_steps = config.total_epochs * self.observe_every

    def run(self):
        x_val, y_val = self.task.data[2], self.task.data[3]
        initial = float(self.model.evaluate(x_val, y_val, verbose=0))
        self.last_good = Snapshot.take(self.model, self.batches, 0, initial)
        self.train(self.observe_every * 2, self.history)
        while self.step < self.total_steps and self.decide():
            pass
        return self.records

    def decide(self):
        """Branches once; returns whether the main line can go on."""
        rollback = self.history.window()[-1, 10] > 0
        base = self.last_good if rollback else Snapshot.take(
            self.model, self.batches, self.step, self.history.last_val_loss)
        window, before = self.history.window(), base.val_loss
        branches = [self.branch(base, i) for i in np.flatnonzero(action_lib.allowed_mask(self.model.optimizer))]
        for action_index, branch in branches:
            self.records.append(self.record(window, base, action_index, branch, before, rollback))
        chosen = self.choose(branches)
        if chosen is None:
            return False
        chosen["end"].restore(self.batches)
        self.step, self.history, self.last_good = chosen["end"].step, chosen["history"], chosen["end"]
        return True

    def branch(self, base, action_index):
        base.restore(self.batches)
        self.step = base.step
        hyperparameters = self.hyperparameters()
        action_lib.apply(self.model.optimizer, action_lib.ACTIONS[action_index])
        history = copy.deepcopy(self.history)
        finite = self.train(self.horizon, history)
        end = Snapshot.take(self.model, self.batches, self.step, history.last_val_loss) if finite else None
        return action_index, {"history": history, "end": end, "val_loss": history.last_val_loss,
                              "train_loss": history.last_loss, "hyperparameters": hyperparameters}

    def choose(self, branches):
        finite = [(i, b) for i, b in branches if b["end"] is not None]
        if not finite:
            return None
        keep = dict(finite).get(action_lib.KEEP)
        if keep is not None and self.rng.random() < self.config.explore:
            return keep
        return min(finite, key=lambda pair: pair[1]["val_loss"])[1]

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
        weights = np.concatenate([np.ravel(w) for w in self.model.get_weights()])
        optimizer = self.model.optimizer
        history.observe(Observation(
            step=self.step, loss=float(loss), val_loss=val_loss,
            learning_rate=applied_learning_rate(optimizer),
            momentum=current_momentum(optimizer), weights=weights,
            budget_used=min(self.step / self.total_steps, 1.0)))
        finite = math.isfinite(loss) and math.isfinite(val_loss) and bool(np.all(np.isfinite(weights)))
        if finite and history is self.history:
            self.last_good = Snapshot.take(self.model, self.batches, self.step, val_loss)
        return finite

    def hyperparameters(self):
        optimizer = self.model.optimizer
        return {"optimizer": self.task.optimizer, "batch_size": self.task.batch_size,
                "learning_rate": applied_learning_rate(optimizer),
                "momentum": current_momentum(optimizer)}

    def record(self, window, base, action_index, branch, before, rollback):
        after = branch["val_loss"]
        diverged = branch["end"] is None
        score = DIVERGED_SCORE if diverged else float(
            np.clip(math.log((after + _TINY_LOSS) / (before + _TINY_LOSS)), -5.0, 5.0))
        return AdjustmentRecord(
            run_id=self.task.name, task=self.task.name, family=self.task.family, step=base.step,
            features=window, hyperparameters=branch["hyperparameters"],
            adjustment={"action": int(action_index), **action_lib.ACTIONS[action_index],
                        "rollback": bool(rollback)},
            outcome={"val_loss_before": before, "val_loss_after": None if diverged else after,
                     "train_loss_after": None if diverged else branch["train_loss"],
                     "diverged": diverged, "horizon": self.horizon, "score": score})


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
        return cls(training_state.snapshot(training_state.state_variables(model)),
                   batches.position, step, val_loss)

    def restore(self, batches):
        training_state.restore(self.state)
        batches.position = self.position
