"""`DeadRunRescue`: rolls a run left at chance (or blown up) back, and restarts it at a new rate."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import keras

from kadapt.meta.live.adjuster_state import load_state
from kadapt.meta.live.adjuster_state import save_state
from kadapt.meta.live.dead_run import AT_CHANCE
from kadapt.meta.live.dead_run import DIVERGED
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.meta.live.dead_run import RunHealth
from kadapt.meta.observe import rollback
from kadapt.optimizers.live_rate import live_rate_of
from kadapt.optimizers.live_rate import set_learning_rate_multiplier
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.validation import check_range

DECISIONS_FILE = "meta_decisions.jsonl"  # the MetaAdjuster's: one log of everything that changed a run
STATE_FILE = "dead-run-rescue-epoch-{epoch}.npz"  # in `backup_dir`
TRIGGERS = (AT_CHANCE, DIVERGED)


class DeadRunRescue(keras.callbacks.Callback):
    """Acts on `kadapt.meta.live.dead_run.DeadRunRule` at every epoch end.

    When the rule triggers, the model goes back to its last healthy state
    (the initial weights, or the epoch end with the lowest monitored loss
    below chance; optimizer slots zeroed: a velocity built at the dying rate
    would carry the weights straight back out), and the rate changes through
    `learning_rate_multiplier`, the live channel of kadapt's optimizers, which
    `kadapt.optimizers.live_rate` installs on any other Keras optimizer at
    train begin, so a schedule keeps its shape: applied rate = schedule(step)
    x multiplier.
    The new rate is the range test's suggestion (as the schedule's peak) when
    `range_test` is given, else the rate the epoch trained at times the rule's
    `rate_factor`. After a divergence it is the suggestion over `rate_factor`
    (the test reads low), at most the rate the epoch trained at times
    `rate_factor` (a callback before this one that cut the rate at the same
    epoch end does not cut it twice). The step count goes on (the schedule is
    not restarted). Each action is one line of
    `log_dir/meta_decisions.jsonl`, in the `MetaAdjuster`'s format, with its
    trigger (`"at_chance"`, `"diverged"`) and reason. Nothing is done after
    the last epoch (no epoch would train from the restored weights). A
    healthy run is not touched: the callback only reads the epoch's logs and
    copies weights.

    It is also a part of the `MetaAdjuster` (its `rescue`, on by default),
    which builds the rule from the compiled loss and the targets `fit` trains
    on, writes the part's decisions to its own `decision_log` and saves the
    part's state (`get_state`) in its own; alone, it writes and saves its own.

    Args:
        rule: `DeadRunRule` or `None`. When to act, and how often at most;
            `None`: set `rule` before the first epoch ends (the `MetaAdjuster`
            sets it from the targets of fit's first epoch).
        monitor: String. `"val_loss"`, or `"loss"` without validation data.
            Defaults to `"val_loss"`.
        range_test: `kadapt.meta.RangeTestStart` or `None`. Finds the new rate
            on the training data from the restored weights. Defaults to `None`.
        peak_learning_rate: Positive float or `None`. The schedule's peak before
            the multiplier, which the range test's suggestion replaces; `None`
            for a constant rate (read from the optimizer). Defaults to `None`.
        log_dir: Path-like or `None`. Where `meta_decisions.jsonl` is appended to.
            Defaults to `None`.
        backup_dir: Path-like or `None`. The run's `BackupAndRestore`
            directory: the state (the rule's, the rollback point, the
            decisions) is saved there at every epoch end and read back when a
            resumed `fit` begins, so the resumed run acts as the uninterrupted
            one would. Defaults to `None`.
        verbose: Bool. Print each action. Defaults to `True`.

    Example:

    ```python
    rule = kadapt.meta.live.dead_run.DeadRunRule(chance_loss(y_train, 3))
    model.compile(kadapt.optimizers.SGD(0.2), ...)
    model.fit(x, y, validation_split=0.1, epochs=10, callbacks=[DeadRunRescue(rule)])
    ```
    """

    def __init__(self, rule: DeadRunRule | None, monitor: str = "val_loss", range_test: Any = None,
                 peak_learning_rate: float | None = None, log_dir: str | os.PathLike | None = None,
                 backup_dir: str | os.PathLike | None = None, verbose: bool = True) -> None:
        super().__init__()
        if rule is not None and not isinstance(rule, DeadRunRule):
            raise TypeError(f"Argument `rule` must be a DeadRunRule or None. Received: rule={rule!r}")
        if monitor not in ("val_loss", "loss"):
            raise ValueError(f"Argument `monitor` must be 'val_loss' or 'loss'. Received: monitor={monitor!r}")
        if peak_learning_rate is not None:
            check_range("peak_learning_rate", peak_learning_rate, low=0.0, low_open=True)
        self.rule, self.monitor, self.range_test = rule, monitor, range_test
        self.peak_learning_rate, self.verbose = peak_learning_rate, verbose
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.backup_dir = None if backup_dir is None else Path(backup_dir)
        self.decisions = []
        self.decision_log = None  # a `DecisionLog` to write to instead: the MetaAdjuster's, when a part of it

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._multiplier = live_rate_of(self.model)
        self.state, self.point, self._best, self._began = None, None, math.inf, False
        self._initial_loss = None
        self.decisions = []

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._began:
            self._began = True
            if epoch > 0 and self.backup_dir is not None:
                self._resume(epoch)
        # The multiplier this epoch trains at: a callback before this one (the MetaAdjuster in
        # `kadapt train`) may cut it at the same epoch end, and the cut after a divergence is
        # from the rate that diverged, not from that callback's cut of it.
        self._trained_multiplier = self._multiplier_now()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Here rather than at train begin: a subclassed model is built by fit, before its first step.
        if self.point is None:
            if not self.model.optimizer.built:  # as the first step would, so the start can be restored
                self.model.optimizer.build(self.model.trainable_variables)
            self.point = rollback.take(self.model)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._initial_loss is not None or not logs or "loss" not in logs:
            return
        initial = self._initial_loss = float(logs["loss"])  # the first batch's, at the initial weights
        self.point = rollback.RollbackPoint(self.point.weights, self.point.optimizer, initial)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.rule is None:
            raise ValueError("DeadRunRescue has no `rule` at the end of epoch 1: pass one, or set it before.")
        logs = logs or {}
        loss = float(logs.get("loss", math.nan))
        monitored = float(logs.get(self.monitor, loss))
        verdict = self.rule.judge(self.state or self.rule.start(self._initial_loss or math.inf), loss, monitored)
        self.state = verdict.state
        if verdict.trigger is not None and epoch + 1 < (self.params.get("epochs") or math.inf):
            self._rescue(epoch, verdict, loss, monitored)  # at the last epoch a restart would end at the start
        elif monitored < min(self._best, self.rule.chance_loss):
            self._best = monitored
            self.point = rollback.take(self.model, value=loss)
        if self.backup_dir is not None:
            self._save(epoch + 1)

    def _rescue(self, epoch, verdict, loss, monitored):
        optimizer = self.model.optimizer
        rollback.restore(self.model, self.point, restart_momentum=True)
        self.state = self.rule.restarted(self.state, self.point.value)
        before = self._multiplier_now()
        multiplier, how = self._new_multiplier(max(before, self._trained_multiplier), verdict.trigger)
        set_learning_rate_multiplier(optimizer, multiplier)
        chance = self.rule.chance_loss if math.isfinite(self.rule.chance_loss) else None  # JSON has no inf
        self._log({"step": int(optimizer.iterations.numpy()), "epoch": epoch, "trigger": verdict.trigger,
                   "adjustment": {"learning_rate_multiplier": multiplier}, "predicted_gain": None,
                   "action": f"rollback to the {'initial' if math.isinf(self._best) else 'best healthy'} "
                             f"weights, lr x{multiplier / before:.3g} ({how})",
                   "rollback": True, "reason": verdict.reason,
                   "features": {"loss": loss, self.monitor: monitored, "chance_loss": chance}})

    def _new_multiplier(self, multiplier, trigger):
        """`(multiplier, how)`: from the range test's suggestion, else `multiplier` (the epoch's,
        or the one set since where higher) times `rate_factor`.

        After a divergence the run has two readings of its rate: the range
        test's suggestion, a low one (a short sweep's steepest descent), and
        the rate that diverged, an upper bound. The new rate is one step of
        `rate_factor` inside each, the lower of the two: the suggestion over
        `rate_factor`, at most the diverged rate times `rate_factor` (a range
        test on badly scaled rows can suggest the rate that just diverged)."""
        factor = self.rule.rate_factor
        cut = multiplier * factor
        if self.range_test is None:
            return cut, f"x{factor:g}"
        try:
            result = self.range_test.run(self.model, self.range_test.max_steps)
        except ValueError as error:  # its first sentence: the rest advises a caller of `find_learning_rate`
            reading = " ".join(str(error).split()).split(". ")[0]
            return cut, f"the range test read no rate: {reading[:1].lower()}{reading[1:]}; x{factor:g}"
        # The schedule's rate now: the applied rate over the multiplier applied now, which a callback
        # before this one may have cut at this epoch end (not the epoch's `multiplier`).
        optimizer = self.model.optimizer
        peak = self.peak_learning_rate or applied_learning_rate(optimizer) / self._multiplier_now()
        found = result.suggestion / peak
        if trigger != DIVERGED:
            return found, f"range test: {result.suggestion:.3g}"
        if found / factor > cut:
            return cut, (f"range test: {result.suggestion:.3g}, x{1 / factor:g} of it above x{factor:g} "
                         "of the diverged rate")
        return found / factor, f"range test: {result.suggestion:.3g}, x{1 / factor:g} of it"

    def _multiplier_now(self):
        return float(keras.ops.convert_to_numpy(self._multiplier))

    def _log(self, decision):
        self.decisions.append(decision)
        if self.decision_log is not None:
            self.decision_log.write(decision)
            return
        if self.log_dir is not None:
            with open(self.log_dir / DECISIONS_FILE, "a") as file:
                file.write(json.dumps(decision) + "\n")
        if self.verbose:
            print(f"\nDeadRunRescue epoch {decision['epoch'] + 1}: {decision['trigger']} -> {decision['action']}: "
                  f"{decision['reason']}", flush=True)

    def get_state(self) -> dict[str, Any]:
        """What the rescue's later actions depend on: the rule's state, the best healthy loss, the
        rollback point and the decisions so far, as arrays and JSON values (during `fit`)."""
        return {"health": None if self.state is None else dataclasses.asdict(self.state),
                "best": self._best, "point": rollback.to_state(self.point), "decisions": list(self.decisions)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores what `get_state` returned, into the running `fit` of the same model."""
        self.state = None if state["health"] is None else RunHealth(**state["health"])
        self._best, self.decisions = float(state["best"]), list(state["decisions"])
        self.point = rollback.from_state(state["point"], self.model)
        self._initial_loss = self.point.value  # the run's first loss was taken before the interruption

    def _save(self, epochs_done):
        """The state after `epochs_done` epochs, beside the backup; the last two kept (as the MetaAdjuster's)."""
        save_state(self.backup_dir / STATE_FILE.format(epoch=epochs_done), {"epoch": epochs_done, **self.get_state()})
        stale = self.backup_dir / STATE_FILE.format(epoch=epochs_done - 2)
        stale.unlink(missing_ok=True)

    def _resume(self, epoch):
        """At the first epoch of a `fit` resumed at `epoch`: the state saved after `epoch - 1` epochs."""
        path = self.backup_dir / STATE_FILE.format(epoch=epoch)
        if not path.is_file():
            raise RuntimeError(f"Training resumes at epoch {epoch}, but {self.backup_dir} holds no DeadRunRescue "
                               "state for it. Resume with the backup_dir the interrupted run used, or start afresh.")
        self.set_state(load_state(path))
        if self.log_dir is not None:
            self._rewrite_log()

    def _rewrite_log(self):
        """The log as the others left it, with this callback's decisions as restored (the
        MetaAdjuster rewrites the log with its own at a resume)."""
        path = self.log_dir / DECISIONS_FILE
        lines = path.read_text().splitlines() if path.is_file() else []
        others = [line for line in lines if json.loads(line).get("trigger") not in TRIGGERS]
        aside = path.with_name(path.name + ".partial")  # replaced whole, as the MetaAdjuster's rewrite
        aside.write_text("".join(line + "\n" for line in [*others, *map(json.dumps, self.decisions)]))
        os.replace(aside, path)

    def get_config(self) -> dict[str, Any]:
        return {"rule": None if self.rule is None else self.rule.get_config(), "monitor": self.monitor,
                "peak_learning_rate": self.peak_learning_rate,
                "log_dir": None if self.log_dir is None else str(self.log_dir),
                "backup_dir": None if self.backup_dir is None else str(self.backup_dir), "verbose": self.verbose}
