"""`MetaAdjuster`: the meta-model adjusts the live optimizer inside `model.fit`."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kadapt.meta import actions as action_lib
from kadapt.meta import rollback
from kadapt.meta.adjuster_state import load_state
from kadapt.meta.adjuster_state import save_state
from kadapt.batching.training_state import restore
from kadapt.meta.branch_trials import branch_scores
from kadapt.meta.features import FEATURE_NAMES
from kadapt.meta.features import FeatureHistory
from kadapt.meta.meta_model import MIN_GAIN
from kadapt.meta.meta_model import check_spec
from kadapt.meta.meta_model import load_meta_model
from kadapt.meta.observation import observe_model
from kadapt.meta.policy import AdjustmentPolicy
from kadapt.meta.policy import PolicyState
from kadapt.meta.policy import model_predictor
from kadapt.meta.range_test_start import RangeTestStart
from kadapt.meta.start_judge import SPREAD
from kadapt.meta.triggers import Trigger
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum
from kadapt.validation import check_range

DECISIONS_FILE = "meta_decisions.jsonl"
STATE_FILE = "meta-adjuster-epoch-{epoch}.npz"  # in `backup_dir`; the last two epochs are kept
_ANNEALING_TOLERANCE = 1e-6  # relative: a constant rate read back from float32 is not "falling"
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

    The decision itself is `kadapt.meta.policy.AdjustmentPolicy`'s, a pure
    object fed the window, the rate and the trigger's reason; the callback
    executes it (rollback, action, log). With `backup_dir` (the directory of
    the run's `BackupAndRestore`) its whole state — history, trigger, rollback
    points, ceiling, decisions — is saved there at every epoch end and restored
    when a resumed `fit` begins its first epoch, so the resumed run adjusts as
    the uninterrupted one would.

    With `range_test` (a `kadapt.meta.RangeTestStart`, which holds the data:
    Keras shows a callback none of fit's), a learning-rate range test runs
    before the first step, from the model's state, which it puts back. Then
    the start's judge rules: by default, from a snapshot, the live rate, the
    suggestion and rates near it each train a few steps and are scored on
    held batches, the rate moves to the best candidate only where it is
    clearly better ("range test: lr x...", each candidate's score logged
    under `"range_test"`), and the run goes on from the end of the chosen
    rate's branch (the live rate's where it is kept); with `judge="always"`,
    wherever the live rate is more than the start's `factor` off the
    suggestion. Otherwise, or where the curve gives no rate (it never fell),
    the rate is kept and the reason logged.
    The suggestion then stays in every observation the meta-model sees (the
    `range_test_gap` feature: how far the live rate is from it), so the
    meta-model, trained on runs with and without a test, can act on it later.
    The test's steps and those of the branches not continued are charged to
    the run: counted as steps trained, and `fit` ends once they and fit's
    together reach `epochs x steps per epoch`.

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
        backup_dir: Path-like or `None`. Where the state lives between an
            interrupted run and its resume (`get_state`, as `.npz`). Defaults
            to `None` (kept in memory only).
        range_test: `kadapt.meta.RangeTestStart` or `None`. The range test
            to start from. Defaults to `None` (none).

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
                 min_gain: float = MIN_GAIN, backup_dir: str | os.PathLike | None = None,
                 range_test: RangeTestStart | None = None) -> None:
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
        self.backup_dir = None if backup_dir is None else Path(backup_dir)
        self.verbose = verbose
        if range_test is not None and not isinstance(range_test, RangeTestStart):
            raise TypeError("Argument `range_test` must be a kadapt.meta.RangeTestStart or None. "
                            f"Received: range_test={range_test!r}")
        self.range_test = range_test
        self.decisions = []

    def __deepcopy__(self, memo):
        # KerasTuner deep-copies callbacks per trial: share the (read-only) meta-model.
        clone = copy.copy(self)
        clone._trigger_template = copy.deepcopy(self._trigger_template, memo)
        clone.decisions = []
        return clone

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer = self.model.optimizer
        allowed = action_lib.optimizer_mask(optimizer)
        if not allowed[[i for i in range(len(allowed)) if i != action_lib.KEEP]].any():
            raise ValueError(
                f"MetaAdjuster cannot change anything on optimizer {type(optimizer).__name__}: its "
                "learning rate is a schedule without a live multiplier and its momentum is a "
                "constant. Use kadapt.optimizers.SGD or kadapt.optimizers.Adam (live multiplier "
                "and momentum), or a float learning rate.")
        self.policy = AdjustmentPolicy(model_predictor(self.meta_model), allowed, self.min_gain,
                                       self._trigger_template.patience)
        self._policy_state = PolicyState()
        self._initial_learning_rate = applied_learning_rate(optimizer)
        self._strategy = _multi_worker_strategy(self.model)
        self.history = FeatureHistory()
        self.trigger = copy.deepcopy(self._trigger_template)
        self.decisions, self._step = [], int(optimizer.iterations.numpy())
        self._last_good = self._pending = None
        if self.model.trainable_variables:
            self._hold_start()
        self._epoch_decisions, self._interval_start = 0, (0, 0.0)
        self._last_epoch_ending = False
        self._scheduled = []
        self._began = False
        self._range_tested, self._range_test_steps = self.range_test is None, 0
        self._range_test_rate = None  # the test's suggestion: a feature of every later observation
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
        self._last_good = self._pending = rollback.take(self.model)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._began:
            self._began = True
            self._resume(epoch)
        self._last_epoch_ending = False
        self._epoch, self._epoch_decisions, self._interval_start = epoch, 0, (0, 0.0)
        self._epoch_start_step = self._step

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Here rather than at train begin: fit has built the model and optimizer by now, and on
        # JAX it reads the variables into its state after the first batch's begin.
        if not self._range_tested:
            self._range_tested = True
            self._start_from_range_test()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Counted here rather than read from `iterations`, which would cost a device sync per step.
        self._step = self._epoch_start_step + batch + 1
        if self._range_test_steps and self._step >= (self._total_steps() or math.inf):
            self.model.stop_training = True  # the range test's steps were charged to the budget
        if self._last_good is None:
            self._hold_start()
        if not logs or "loss" not in logs:
            return
        if self._last_good.value == math.inf:
            # The first batch's loss was measured at the initial weights: the reference for
            # "exploded", and the value of the initial state a rollback may return to.
            self._last_good = self._pending = dataclasses.replace(self._last_good, value=float(logs["loss"]))
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
        if self.backup_dir is not None:
            self._save(epoch + 1)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._last_good is not None and not _all_finite(self.model.variables):
            rollback.restore(self.model, self._last_good)

    def _start_from_range_test(self):
        """Runs the range test, charges its steps, and moves the rate as the start's judge rules."""
        budget = self._total_steps()
        num_steps = self.range_test.num_steps(budget)
        if num_steps is None:
            self._log_range_test("keep", {"why": f"no room for a range test in a budget of {budget} steps"})
            return
        live = applied_learning_rate(self.model.optimizer)
        try:
            result = self.range_test.run(self.model, num_steps)
        except ValueError as error:
            # A curve no rate can be read off: the test ran (up to num_steps), the rate stays.
            self._charge(num_steps)
            self._log_range_test("keep", {"why": str(error), "learning_rate": live})
            return
        self._charge(result.steps_run)
        self._range_test_rate = float(result.suggestion)
        detail = {"suggestion": result.suggestion, "steps_run": result.steps_run, "learning_rate": live}
        settable = action_lib.can_adjust_learning_rate(self.model.optimizer)
        if self.range_test.judge is None:
            rate = self.range_test.choose(live, result.suggestion)
            why = f"within {self.range_test.factor:g}x of the suggestion"
        if not settable:
            rate, why = None, "the optimizer's rate cannot be set live"
        elif self.range_test.judge is not None:
            rate, why, judged = self._judge_start(live, result.suggestion, budget)
            detail.update(judged)
        continued = detail.get("continued_from")
        if rate is None:
            self._log_range_test("keep", {**detail, "why": why})
        else:
            if continued is None:
                self._set_learning_rate(live, rate)
            elif not hasattr(self.model.optimizer, "learning_rate_multiplier"):
                self._initial_learning_rate = rate  # the branch's end holds the rate; as _set_learning_rate
            self._log_range_test(f"range test: lr x{rate / live:.3g}", detail)
        if continued is not None:  # the run goes on from a branch's end: a rollback returns there
            self._last_good = self._pending = rollback.take(self.model)

    def _judge_start(self, live, suggestion, budget):
        """Branches from the state now at each candidate rate (their steps charged) and returns
        the judge's rate (`None`: keep), why it kept, and the candidates' scores to log."""
        judge = self.range_test.judge
        rates = judge.candidates(live, suggestion)
        if rates == (live,):  # the suggestion is within SPREAD of the live rate: nothing to judge, nothing charged
            return None, f"within {SPREAD:g}x of the suggestion", {}
        steps = judge.steps_per_branch(budget, len(rates))
        if steps < 1:
            return None, f"no room for branches in a budget of {budget} steps", {}
        try:
            train, held = self.range_test.branch_batches(steps, judge.held_batches)
        except ValueError as error:
            return None, str(error), {}
        optimizer = self.model.optimizer
        trials = branch_scores(self.model, rates, lambda rate: _apply_rate(optimizer, live, rate), train, held,
                               keep_ends=self.range_test.continue_branch)
        chosen = judge.choose(live, trials.start, trials.scores)
        judged = {"branch_steps": steps, "held_batches": len(held), "held_loss": _json_number(trials.start),
                  "branches": [{"learning_rate": rate, "held_loss": _json_number(score)}
                               for rate, score in trials.scores.items()]}
        end = trials.ends.get(live if chosen is None else chosen)
        if end is not None:  # its steps are the run's: trained, not lost
            restore(end)
            judged["continued_from"] = live if chosen is None else chosen
        self._charge(steps * len(rates), kept=0 if end is None else steps)
        why = f"no candidate's gain in held loss more than {1 + judge.margin:g}x the live rate's"
        return chosen, why, judged

    def _charge(self, steps, kept=0):
        """Counts `steps` trained before fit's first step; all but `kept` of them were undone
        (the test's, the branches not continued): those are charged to the budget."""
        self._range_test_steps += steps - kept
        self._step += steps
        self._epoch_start_step += steps

    def _set_learning_rate(self, live, rate):
        _apply_rate(self.model.optimizer, live, rate)
        if not hasattr(self.model.optimizer, "learning_rate_multiplier"):
            self._initial_learning_rate = rate  # later changes stay within MAX_CHANGE of the found rate

    def _log_range_test(self, action, detail):
        self._log({"step": self._step, "epoch": getattr(self, "_epoch", 0), "trigger": "range_test",
                   "adjustment": {}, "action": action, "predicted_gain": None, "rollback": False,
                   "features": {}, "range_test": detail})

    def _total_steps(self):
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        return epochs * steps if epochs and steps else None

    def _observe(self, loss, val_loss, watched, measured_now):
        observation = self._observation(loss, val_loss)
        self.history.observe(observation)
        finite = _finite(loss) and _finite(watched) and bool(np.all(np.isfinite(observation.weights)))
        reason = self._chiefs_reason(self.trigger.update(watched if finite else math.nan))
        adjustment, self._policy_state = self.policy.decide(
            self._policy_state, self.history.window(), reason, self._rates[0],
            annealing=self._annealing(), final=self._is_final(), suggestion=self._range_test_rate)
        self._execute(self._chiefs_choice(adjustment), watched, finite, measured_now)

    def _execute(self, adjustment, watched, finite, measured_now):
        """Does what the policy chose: roll back, move the rollback point, apply, log."""
        if adjustment.rollback:
            rollback.restore(self.model, self._last_good, restart_momentum=adjustment.restart_momentum)
            self._pending = self._last_good
            self.trigger.rebaseline(self._last_good.value)
        elif finite:
            self._advance_rollback_point(watched, measured_now)
        if adjustment.consulted:
            self._apply(action_lib.ACTIONS[adjustment.action])
        if adjustment.restart_trigger:
            self.trigger.adjusted()
        if adjustment.logged:
            self._log(self._record(adjustment, self.history.window()))

    def _advance_rollback_point(self, watched, measured_now):
        point = rollback.take(self.model, watched)
        if measured_now:
            self._last_good = self._pending = point
        else:
            # A training loss was measured before the latest updates: the weights now are
            # confirmed good only by the next observation.
            self._last_good, self._pending = self._pending, point

    def _apply(self, action):
        action_lib.apply(self.model.optimizer, action, self._initial_learning_rate, self._range_test_rate)
        self._rates = self._read_rates()
        # A float rate the action just set is not the schedule annealing.
        self._scheduled[-1] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def _chiefs_reason(self, reason):
        """`reason`, or in a multi-worker job the chief's: the logs are synchronized, yet a
        worker on other hardware could round a threshold differently, and every worker must
        act at the same observation."""
        if self._strategy is None:
            return reason
        (code,) = self._from_chief(_REASONS.index(reason))
        return _REASONS[int(code)]

    def _chiefs_choice(self, adjustment):
        """`adjustment`, or in a multi-worker job with the chief's action: every worker applies
        the same one at this step."""
        if self._strategy is None or not adjustment.consulted:
            return adjustment
        index, gain, considered = self._from_chief(adjustment.action, adjustment.gain, adjustment.considered)
        return dataclasses.replace(adjustment, action=int(index), gain=gain, considered=int(considered))

    def _from_chief(self, *values):
        from kadapt.batching.tensorflow.multi_worker import chief_values

        return chief_values(self._strategy, [float(v) for v in values])

    def _annealing(self):
        """Whether the schedule (the rate before the live multiplier) fell since the last observation."""
        scheduled = self._scheduled
        return len(scheduled) >= 2 and scheduled[-1] < scheduled[-2] * (1 - _ANNEALING_TOLERANCE)

    def _read_rates(self):
        optimizer = self.model.optimizer
        return applied_learning_rate(optimizer), current_momentum(optimizer)

    def _observation(self, loss, val_loss):
        self._scheduled = self._scheduled[-1:] + [float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))]
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        observation = observe_model(self.model, self._step, loss, val_loss, self._budget_used(),
                                    epochs * steps if epochs and steps else None, self._range_test_rate)
        self._rates = observation.learning_rate, observation.momentum
        return observation

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

    def _record(self, adjustment, window):
        record = {"step": self._step, "epoch": getattr(self, "_epoch", 0), "trigger": adjustment.reason,
                  "adjustment": dict(action_lib.ACTIONS[adjustment.action]), "action": adjustment.text,
                  "predicted_gain": round(adjustment.gain, 4), "rollback": adjustment.rollback,
                  "features": _summary(window), "learning_rate": self._rates[0], "momentum": self._rates[1]}
        if adjustment.consulted:
            record["applied"] = not adjustment.abstained
        return record

    def get_state(self) -> dict[str, Any]:
        """Everything the adjuster's later decisions depend on, as arrays and JSON values.

        The feature history, the trigger's losses and cooldown, the policy's
        ceiling and divergence count, the two rollback points (weights and
        optimizer slots), the schedule's last rates, the initial rate and the
        decisions so far. Call it while training (after `on_train_begin`).
        """
        state = dataclasses.asdict(self._policy_state)
        return {"history": self.history.get_state(), "trigger": self.trigger.get_state(), "policy": state,
                "last_good": rollback.to_state(self._last_good), "pending": rollback.to_state(self._pending),
                "scheduled": list(self._scheduled), "initial_learning_rate": float(self._initial_learning_rate),
                "range_test_steps": self._range_test_steps, "range_test_rate": self._range_test_rate,
                "decisions": copy.deepcopy(self.decisions)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores what `get_state` returned, into the running `fit` of the same model.

        The decision log (`log_dir/meta_decisions.jsonl`) is rewritten to hold
        exactly the restored decisions.
        """
        self._last_good = rollback.from_state(state["last_good"], self.model)
        self._pending = rollback.from_state(state["pending"], self.model)
        self.history.set_state(state["history"])
        self.trigger.set_state(state["trigger"])
        self._policy_state = PolicyState(**state["policy"])
        self._scheduled = [float(v) for v in state["scheduled"]]
        self._initial_learning_rate = float(state["initial_learning_rate"])
        # A resumed run does not test again: its rate was set by the first run's test.
        self._range_tested, self._range_test_steps = True, int(state.get("range_test_steps", 0))
        self._range_test_rate = state.get("range_test_rate")
        self.decisions = list(state["decisions"])
        if self.log_dir is not None:
            lines = "".join(json.dumps(decision) + "\n" for decision in self.decisions)
            aside = self.log_dir / (DECISIONS_FILE + ".partial")
            aside.write_text(lines)
            os.replace(aside, self.log_dir / DECISIONS_FILE)

    def _save(self, epochs_done):
        """Writes the state after `epochs_done` epochs beside the backup; keeps the last two
        (a backup that falls back to its previous checkpoint finds the state of that epoch)."""
        save_state(self.backup_dir / STATE_FILE.format(epoch=epochs_done), {"epoch": epochs_done, **self.get_state()})
        for path in self.backup_dir.glob(STATE_FILE.format(epoch="*")):
            epoch = path.name[len("meta-adjuster-epoch-"):-len(".npz")]
            if epoch.isdigit() and int(epoch) < epochs_done - 1:
                path.unlink()

    def _resume(self, epoch):
        """At the first epoch of a `fit` resumed at `epoch` > 0: the state saved after `epoch - 1`."""
        if self.backup_dir is None or epoch == 0:
            return
        path = self.backup_dir / STATE_FILE.format(epoch=epoch)
        if not path.is_file():
            raise RuntimeError(
                f"Training resumes at epoch {epoch}, but {self.backup_dir} holds no MetaAdjuster state for "
                "it: the adjuster would restart blind (no history, no rollback point). Resume with the "
                "backup_dir the interrupted run used, or start the run afresh.")
        state = load_state(path)
        if state.get("epoch") != epoch:
            raise ValueError(f"The MetaAdjuster state {path} is of epoch {state.get('epoch')!r}, not {epoch}: "
                             "it was not written by this run. Start the run afresh.")
        self.set_state(state)
        self._step = int(self.model.optimizer.iterations.numpy()) + self._range_test_steps

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


def _apply_rate(optimizer, live, rate):
    """Makes `optimizer` apply `rate` where it applies `live` now: through its live multiplier
    (which keeps a schedule's shape), or as its float rate."""
    if hasattr(optimizer, "learning_rate_multiplier"):
        multiplier = float(keras.ops.convert_to_numpy(optimizer.learning_rate_multiplier))
        optimizer.learning_rate_multiplier = multiplier * rate / live
    else:
        optimizer.learning_rate = rate


def _json_number(value):
    return float(value) if math.isfinite(value) else None


def _multi_worker_strategy(model):
    """The model's `MultiWorkerMirroredStrategy` spanning several processes, else `None`.
    Only the TensorFlow backend has one (imported only there)."""
    if keras.backend.backend() != "tensorflow":
        return None
    from kadapt.batching.tensorflow.multi_worker import in_multi_worker_mode

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
    return {name: round(float(value), 4) for name, value in zip(FEATURE_NAMES, window[-1])}
