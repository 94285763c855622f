"""`MetaAdjuster`: the meta-model adjusts the live optimizer inside `model.fit`."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kadapt.meta import actions as action_lib
from kadapt.meta.features import FeatureHistory
from kadapt.meta.features import Observation
from kadapt.meta.features import schedule_ratio
from kadapt.meta.meta_model import MIN_GAIN
from kadapt.meta.meta_model import Choice
from kadapt.meta.meta_model import check_spec
from kadapt.meta.meta_model import choose
from kadapt.meta.meta_model import load_meta_model
from kadapt.meta.triggers import Trigger
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum
from kadapt.validation import check_range

DECISIONS_FILE = "meta_decisions.jsonl"
# A rollback restores weights and optimizer slots, not the channels the adjuster itself moves,
# nor the step count (schedules and the budget keep going forward).
_NOT_ROLLED_BACK = {"iteration", "learning_rate", "learning_rate_multiplier", "momentum", "beta_1"}
# After a rollback only these may follow: the step that diverged must not be retried as it was.
_REDUCTIONS = np.array([a.get("learning_rate_multiplier", 1.0) < 1.0 for a in action_lib.ACTIONS])
_LARGEST_CUT = np.array([a.get("learning_rate_multiplier") == 0.1 for a in action_lib.ACTIONS])
# Left to a schedule while it anneals: it slows the loss on purpose, and damps an oscillation itself.
_LEFT_TO_SCHEDULE = ("plateau", "slow_progress", "oscillation")
_ANNEALING_TOLERANCE = 1e-6  # relative: a constant rate read back from float32 is not "falling"
_FACTORS = np.array([a.get("learning_rate_multiplier", 1.0) for a in action_lib.ACTIONS])
_REASONS = (None, "divergence", "plateau", "oscillation", "slow_progress")  # Trigger.update's answers


class MetaAdjuster(keras.callbacks.Callback):
    """Watches the loss and lets a meta-model adjust the learning rate and momentum mid-fit.

    At every observation (each epoch end, or every `check_every` steps) it
    adds a row to the run's feature history (`kadapt.meta.features`). When
    `target` is reached it stops training. Otherwise, when its `Trigger`
    fires — plateau, oscillation, slow progress or divergence — it feeds the
    last window to the meta-model and applies the action it picks:

    - the learning rate is multiplied (×0.1 … ×10, both directions) through the
      optimizer's live `learning_rate_multiplier` (kadapt `SGD`/`Adam`; works
      under a schedule) or, for a stock Keras optimizer, by setting its float
      `learning_rate` — exactly where `ReduceLROnPlateau` would act;
    - the momentum (`beta_1` for Adam) is set, with a live-momentum optimizer.

    On divergence (NaN/Inf, or an exploding loss) it first restores the last
    good weights and optimizer state, and then may only lower the learning
    rate; later raises stay below half the rate that diverged. If it diverges
    again within `patience` observations, the rate is cut ×0.1 and the
    optimizer's per-weight slots (momentum, moments) restart from zero, since
    a velocity built at the diverging rate would carry the restored weights
    straight back out. A run never ends on non-finite weights.

    A slowdown (plateau, slow progress) or an oscillation is left alone while
    the optimizer's learning-rate schedule is annealing — its rate before this
    step lower than at the last observation — because a decaying schedule is
    meant to slow the loss and lowers the rate that makes it oscillate, and
    cutting the rate on top of it only ends the run early; divergence is still
    acted on. Nothing is adjusted at the last observation (the end of
    `epochs x steps`, or once something stopped training): no later step
    would feel it. A divergence there is still rolled back, and logged as a
    rollback.

    Each decision goes to `decisions`, to `log_dir/meta_decisions.jsonl`, and
    (as `meta_*` entries of the epoch logs) to History and to a TensorBoard
    callback placed after this one. In step mode an observation is the
    training loss of the last `check_every` steps (the meta-model then sees
    no validation loss); epoch ends still check `target` and non-finite losses.

    Under `tf.distribute.MultiWorkerMirroredStrategy` every worker follows the
    chief: its trigger reason at each observation and its chosen action (one
    small all-gather each), so all workers adjust at the same step alike.

    Args:
        meta_model: `"default"`, the path of a `.keras` meta-model, or a loaded
            one. Defaults to `"default"`.
        monitor: String. The loss or metric of the logs to watch and compare
            with `target`. Defaults to `"val_loss"`.
        target: Float or `None`. Stop when `monitor` reaches it. Defaults to `None`.
        mode: `"min"`, `"max"` or `"auto"` (max for accuracy-like names).
        check_every: `"epoch"` or a positive int of steps. Defaults to `"epoch"`.
        trigger: `kadapt.meta.Trigger` or `None` (its defaults).
        log_dir: Path or `None`. Where `meta_decisions.jsonl` is written.
        verbose: Int. 1 prints each decision. Defaults to `1`.
        min_gain: Float >= 0. The predicted gain (log of the final validation
            loss keeping would reach over the one the action would) an action
            needs to be applied; below it the adjuster keeps, and logs what it
            considered. Defaults to `0.1` (about 10% lower). After a
            divergence a cut is applied whatever its predicted gain.

    Example:

    ```python
    model.compile(optimizer=kadapt.optimizers.SGD(0.5, momentum=0.9), loss=...)
    model.fit(x, y, validation_split=0.2, epochs=20,
              callbacks=[kadapt.MetaAdjuster(target=0.1, log_dir="runs/a")])
    ```
    """

    def __init__(self, meta_model: str | os.PathLike | keras.Model = "default", monitor: str = "val_loss",
                 target: float | None = None, mode: str = "auto", check_every: str | int = "epoch",
                 trigger: Trigger | None = None, log_dir: str | os.PathLike | None = None, verbose: int = 1,
                 min_gain: float = MIN_GAIN) -> None:
        super().__init__()
        check_range("min_gain", min_gain, low=0.0)
        self.min_gain = float(min_gain)
        self.meta_model = _load(meta_model)
        self.monitor, self.target = _check_monitor(monitor), _check_target(target)
        self.mode = _check_mode(mode, monitor)
        if check_every != "epoch":
            check_range("check_every", check_every, low=1, integer=True)
        self.check_every = check_every
        if trigger is not None and not isinstance(trigger, Trigger):
            raise TypeError(f"Argument `trigger` must be a kadapt.meta.Trigger or None. Received: trigger={trigger!r}")
        self._trigger_template = trigger or Trigger()
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.verbose = verbose
        self.decisions = []

    def __deepcopy__(self, memo):
        # KerasTuner deep-copies callbacks per trial: share the (read-only) meta-model.
        clone = copy.copy(self)
        clone._trigger_template = copy.deepcopy(self._trigger_template, memo)
        clone.decisions = []
        return clone

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer = self.model.optimizer
        self._allowed = action_lib.allowed_mask(optimizer)
        if not self._allowed[[i for i in range(len(self._allowed)) if i != action_lib.KEEP]].any():
            raise ValueError(
                f"MetaAdjuster cannot change anything on optimizer {type(optimizer).__name__}: its "
                "learning rate is a schedule without a live multiplier and its momentum is a "
                "constant. Use kadapt.optimizers.SGD or kadapt.optimizers.Adam (live multiplier "
                "and momentum), or a float learning rate.")
        self._initial_learning_rate = applied_learning_rate(optimizer)
        self._strategy = _multi_worker_strategy(self.model)
        self._ceiling = math.inf
        self.history = FeatureHistory()
        self.trigger = copy.deepcopy(self._trigger_template)
        self.decisions, self._step = [], int(optimizer.iterations.numpy())
        self._last_good = self._pending = None
        if self.model.trainable_variables:
            self._hold_start()
        self._since_divergence = None
        self._epoch_decisions, self._interval_start = 0, (0, 0.0)
        self._last_epoch_ending = False
        self._scheduled = []
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            (self.log_dir / DECISIONS_FILE).touch()

    def _hold_start(self):
        """Takes the first state a rollback can return to. A model that its first `fit` step
        builds (a subclassed model never called before) has no variables before that step, so
        its first state is the one after it."""
        optimizer = self.model.optimizer
        if not optimizer.built:  # as fit would at its first step, so the start can be rolled back to
            optimizer.build(self.model.trainable_variables)
        self._trainable = [any(v is t for t in self.model.trainable_variables) for v in self.model.variables]
        self._last_good = self._pending = self._snapshot(math.inf)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._last_epoch_ending = False
        self._epoch, self._epoch_decisions, self._interval_start = epoch, 0, (0, 0.0)
        self._epoch_start_step = self._step

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Counted here rather than read from `iterations`, which would cost a device sync per step.
        self._step = self._epoch_start_step + batch + 1
        if self._last_good is None:
            self._hold_start()
        if not logs or "loss" not in logs:
            return
        if self._last_good.value == math.inf:
            # The first batch's loss was measured at the initial weights: the reference for
            # "exploded", and the value of the initial state a rollback may return to.
            self._last_good.value = float(logs["loss"])
            self.trigger.seed(self._last_good.value)
        if self.check_every == "epoch" or self._step % self.check_every:
            return
        seen = batch + 1
        total = float(logs["loss"]) * seen
        start_seen, start_total = self._interval_start
        self._interval_start = (seen, total)
        loss = (total - start_total) / max(seen - start_seen, 1)
        self._observe(loss, None, loss, measured_now=False)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs if logs is not None else {}
        if self.monitor not in logs:
            raise ValueError(
                f"MetaAdjuster monitors `{self.monitor}`, which is not in the epoch logs "
                f"({sorted(logs)}). Pass validation data to fit, or monitor one of those.")
        loss = float(logs.get("loss", math.nan))
        observed = self.check_every == "epoch" or not _finite(loss)
        self._last_epoch_ending = epoch + 1 >= (self.params.get("epochs") or math.inf)
        self._check_target(float(logs[self.monitor]))
        if observed:
            name = self.monitor if self.mode == "min" else "val_loss"
            watched = float(logs[name]) if name in logs else loss
            # A validation value is measured at the weights as they are now.
            self._observe(loss, logs.get("val_loss"), watched, measured_now=name in logs and name.startswith("val_"))
        if not observed:
            self._rates = self._read_rates()
        logs["meta_learning_rate"], logs["meta_momentum"] = self._rates
        logs["meta_adjustments"] = self._epoch_decisions

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._last_good is not None and not _all_finite(self.model.variables):
            self._restore(self._last_good)

    def _observe(self, loss, val_loss, watched, measured_now):
        snapshot = self._snapshot(watched)
        weights = np.concatenate([np.ravel(w) for w, t in zip(snapshot.weights, self._trainable) if t])
        finite = _finite(loss) and _finite(watched) and bool(np.all(np.isfinite(weights)))
        self.history.observe(self._observation(loss, val_loss, weights))
        reason = self._chiefs_reason(self.trigger.update(watched if finite else math.nan))
        if reason == "divergence":
            self._restore(self._last_good, restart_momentum=self._repeated_divergence())
            self._pending = self._last_good
            self.trigger.rebaseline(self._last_good.value)
        elif finite and measured_now:
            self._last_good = self._pending = snapshot
        elif finite:
            # A training loss was measured before the latest updates: the weights now are
            # confirmed good only by the next observation.
            self._last_good, self._pending = self._pending, snapshot
        if reason in _LEFT_TO_SCHEDULE and self._annealing():
            self.trigger.adjusted()  # the schedule's own "adjustment": wait a full patience again
        elif reason is not None and self._is_final():
            if reason == "divergence":
                self._log(self._record(reason, {}, "rollback (training ends)", 0.0, self.history.window()))
        elif reason is not None:
            self._decide(reason)
        elif self._since_divergence is not None:
            self._since_divergence += 1

    def _chiefs_reason(self, reason):
        """`reason`, or in a multi-worker job the chief's: the logs are synchronized, yet a
        worker on other hardware could round a threshold differently, and every worker must
        act at the same observation."""
        if self._strategy is None:
            return reason
        (code,) = self._from_chief(_REASONS.index(reason))
        return _REASONS[int(code)]

    def _from_chief(self, *values):
        from kadapt.batching.multi_worker import chief_values

        return chief_values(self._strategy, [float(v) for v in values])

    def _annealing(self):
        """Whether the schedule (the rate before the live multiplier) fell since the last observation."""
        scheduled = self._scheduled
        return len(scheduled) >= 2 and scheduled[-1] < scheduled[-2] * (1 - _ANNEALING_TOLERANCE)

    def _read_rates(self):
        optimizer = self.model.optimizer
        return applied_learning_rate(optimizer), current_momentum(optimizer)

    def _observation(self, loss, val_loss, weights):
        self._rates = learning_rate, momentum = self._read_rates()
        self._scheduled = self._scheduled[-1:] + [float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))]
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        ahead = schedule_ratio(self.model.optimizer, self._step, epochs * steps if epochs and steps else None)
        return Observation(step=self._step, loss=loss, val_loss=None if val_loss is None else float(val_loss),
                           learning_rate=learning_rate, momentum=momentum, weights=weights,
                           budget_used=self._budget_used(), schedule_ahead=ahead)

    def _is_final(self):
        """Whether this observation is the last of the run."""
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        if self.model.stop_training:
            return True
        if epochs and steps:
            return self._step >= epochs * steps
        return self._last_epoch_ending

    def _budget_used(self):
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        if epochs and steps:
            return min(self._step / (epochs * steps), 1.0)
        return min(getattr(self, "_epoch", 0) / epochs, 1.0) if epochs else 0.0

    def _decide(self, reason):
        rate = applied_learning_rate(self.model.optimizer)
        if reason == "divergence":
            # Never climb back to a rate that diverged: raises stay below half of it. A second
            # divergence soon after the first takes the largest cut, whatever the model prefers.
            self._ceiling = min(self._ceiling, rate / 2)
            allowed = self._allowed & (_LARGEST_CUT if self._repeated_divergence() else _REDUCTIONS)
            self._since_divergence = 0
        else:
            allowed = self._allowed & ~((_FACTORS > 1) & (_FACTORS * rate > self._ceiling))
        window = self.history.window()
        choice = choose(self.meta_model, window, allowed, self.min_gain)
        if self._strategy is not None:  # every worker applies the chief's choice at this step
            index, gain, considered = self._from_chief(choice.action, choice.gain, choice.considered)
            choice = Choice(int(index), gain, int(considered))
        action = action_lib.ACTIONS[choice.action]
        action_lib.apply(self.model.optimizer, action, self._initial_learning_rate)
        self._rates = self._read_rates()
        # A float rate the action just set is not the schedule annealing.
        self._scheduled[-1] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        self.trigger.adjusted()
        text = action_lib.describe(action)
        if choice.abstained:
            text += f" (considered {action_lib.describe(action_lib.ACTIONS[choice.considered])})"
        decision = self._record(reason, dict(action), text, choice.gain, window)
        decision["applied"] = not choice.abstained
        self._log(decision)

    def _record(self, reason, adjustment, action, gain, window):
        return {"step": self._step, "epoch": getattr(self, "_epoch", 0), "trigger": reason,
                "adjustment": adjustment, "action": action, "predicted_gain": round(gain, 4),
                "rollback": reason == "divergence", "features": _summary(window),
                "learning_rate": self._rates[0], "momentum": self._rates[1]}

    def _repeated_divergence(self):
        return self._since_divergence is not None and self._since_divergence <= self.trigger.patience

    def _check_target(self, value):
        if self.target is None or not _finite(value):
            return
        if (value <= self.target) if self.mode == "min" else (value >= self.target):
            self.model.stop_training = True
            self._log({"step": self._step, "epoch": getattr(self, "_epoch", 0), "trigger": "target",
                       "adjustment": {}, "action": "stop", "predicted_gain": None, "rollback": False,
                       "features": {self.monitor: value}})

    def _log(self, decision):
        self.decisions.append(decision)
        self._epoch_decisions += 1
        if self.log_dir is not None:
            with open(self.log_dir / DECISIONS_FILE, "a") as file:
                file.write(json.dumps(decision) + "\n")
        if self.verbose:
            gain = decision["predicted_gain"]
            print(f"\nMetaAdjuster step {decision['step']}: {decision['trigger']} -> {decision['action']}"
                  + ("" if gain is None else f" (predicted gain {gain:+.3f})"), flush=True)

    def _snapshot(self, value):
        return _Snapshot([v.numpy() for v in self.model.variables],
                         [None if v.name in _NOT_ROLLED_BACK else v.numpy()
                          for v in self.model.optimizer.variables], value)

    def _restore(self, snapshot, restart_momentum=False):
        for variable, value in zip(self.model.variables, snapshot.weights, strict=True):
            variable.assign(value)
        for variable, value in zip(self.model.optimizer.variables, snapshot.optimizer, strict=True):
            if variable.name not in _NOT_ROLLED_BACK:
                variable.assign(np.zeros_like(value) if restart_momentum and value.ndim else value)


class _Snapshot:
    """Weights and optimizer state, with the watched value measured there."""

    def __init__(self, weights, optimizer, value):
        self.weights, self.optimizer, self.value = weights, optimizer, value


def _multi_worker_strategy(model):
    """The model's `MultiWorkerMirroredStrategy` spanning several processes, else `None`.
    Only the TensorFlow backend has one (imported only there)."""
    if keras.backend.backend() != "tensorflow":
        return None
    from kadapt.batching.multi_worker import in_multi_worker_mode

    strategy = model.distribute_strategy
    return strategy if in_multi_worker_mode(strategy) else None


def _load(meta_model):
    if isinstance(meta_model, keras.Model):
        check_spec(meta_model)
        return meta_model
    if isinstance(meta_model, (str, Path)):
        return load_meta_model(meta_model)
    raise TypeError(f"Argument `meta_model` must be \"default\", a .keras path or a keras.Model. "
                    f"Received: meta_model={meta_model!r}")


def _check_monitor(monitor):
    if not isinstance(monitor, str) or not monitor:
        raise TypeError(f"Argument `monitor` must be a log name such as \"val_loss\". Received: monitor={monitor!r}")
    return monitor


def _check_target(target):
    if target is None:
        return None
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
        raise TypeError(f"Argument `target` must be a finite number or None. Received: target={target!r}")
    return float(target)


def _check_mode(mode, monitor):
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"Argument `mode` must be \"auto\", \"min\" or \"max\". Received: mode={mode!r}")
    if mode != "auto":
        return mode
    return "max" if monitor.endswith(("acc", "accuracy", "auc")) else "min"


def _finite(value):
    return value is not None and math.isfinite(float(value))


def _all_finite(variables):
    return all(bool(np.all(np.isfinite(v.numpy()))) for v in variables)


def _summary(window):
    from kadapt.meta.features import FEATURE_NAMES

    return {name: round(float(value), 4) for name, value in zip(FEATURE_NAMES, window[-1])}
