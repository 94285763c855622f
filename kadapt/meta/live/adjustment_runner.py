"""`AdjustmentRunner`: the `MetaAdjuster`'s decisions, run on the live model.

The decision is the pure `AdjustmentPolicy`'s; the runner does the rest, in
this order at each observation: read the model into the feature history
(`observe_model`), ask the trigger for a reason and the policy for an
`Adjustment` (both through the `WorkerAgreement`, so every worker of a job acts
alike), roll back to the last good state or move that point forward, apply the
chosen action to the optimizer, and write the decision to the `DecisionLog`.

It holds what later decisions depend on: the feature history, the trigger, the
policy's state, the two rollback points, the schedule's last two rates and the
rate changes are bounded around, given and taken back as one state (`get_state`).
Where the run stands (its step, epoch and budget) is the callback's to know:
it hands the runner a `Progress` at each observation.

Two rollback points are kept: `last_good` is the state a divergence returns
to; `pending` is the newest state, confirmed good only once a later loss is
measured after it. A validation loss is measured at the weights as they are
now, so it confirms them at once; a training loss was measured before the
interval's last updates, so it confirms only the state of the observation
before. A third, `start`, is the run's initial state, which a restart
(`Adjustment.restart`) returns to; it is held only while a restart can still
come (within `AdjustmentPolicy.restart_within` of the budget). A judged restart
(`Adjustment.restart_trial`) trains a branch from it first
(`kadapt.meta.live.restart_trial`), where the runner has a `RestartTrial`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kadapt.batching import training_state
from kadapt.meta.live.decision_log import DecisionLog
from kadapt.meta.live.policy import Adjustment
from kadapt.meta.live.policy import AdjustmentPolicy
from kadapt.meta.live.policy import PolicyState
from kadapt.meta.live.restart_trial import RestartTrial
from kadapt.meta.live.restart_trial import TrialResult
from kadapt.meta.live.triggers import Trigger
from kadapt.meta.live.worker_agreement import WorkerAgreement
from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.features import FeatureHistory
from kadapt.meta.model.features import Observation
from kadapt.meta.observe import rollback
from kadapt.meta.observe.device_observer import DeviceObserver
from kadapt.meta.observe.host_reads import read_model
from kadapt.meta.observe.observation import observe_model
from kadapt.meta.start.range_test_run import RangeTestRun
from kadapt.optimizers.live_rate import learning_rate_multiplier
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum

CUT = action_lib.ACTIONS.index({"learning_rate_multiplier": 0.1})  # the too-high-rate check's
ANNEALING_TOLERANCE = 1e-6  # relative: a constant rate read back from float32 is not "falling"


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where the run stands at an observation.

    Args:
        step: Int. Steps trained so far (a range test's steps included).
        epoch: Int. The epoch (from 0). Defaults to `0`.
        total_steps: Int or `None`. The steps planned, when known. Defaults to `None`.
        budget_used: Float in [0, 1]. The fraction of the budget done. Defaults to `0.0`.
        final: Bool. Whether this is the run's last observation. Defaults to `False`.
    """

    step: int
    epoch: int = 0
    total_steps: int | None = None
    budget_used: float = 0.0
    final: bool = False


class AdjustmentRunner:
    """Runs the `AdjustmentPolicy`'s decisions on a live model: observe, decide, roll back, apply, record.

    Built when training begins: it takes the model's first rollback point then
    (once the first step has built the model, for a model that has no
    variables before it).

    Args:
        model: A compiled `keras.Model`; its optimizer is the one adjusted.
        policy: `kadapt.meta.AdjustmentPolicy`. What to do at an observation.
        trigger: `kadapt.meta.Trigger`. When to ask the policy; the runner
            updates it, so pass a fresh one.
        log: `kadapt.meta.live.decision_log.DecisionLog`. Where decisions go.
        agreement: `kadapt.meta.live.worker_agreement.WorkerAgreement` or `None`
            (one process). Defaults to `None`.
        restart_trial: `kadapt.meta.RestartTrial` or `None`: the data a judged
            restart's branch trains on; without it a judged restart is a plain
            cut. Defaults to `None`.
        charge: Callable `(steps, kept) -> None` or `None`: told of the steps a
            restart trial trained outside `fit`, `kept` of them the run's own
            (the rest charged to the budget). Required with `restart_trial`.

    Example:

    ```python
    policy = AdjustmentPolicy(model_predictor(meta_model), optimizer_mask(model.optimizer))
    runner = AdjustmentRunner(model, policy, Trigger(), DecisionLog("runs/a"))
    runner.after_step(loss=2.3)              # the first step's loss: the start's value
    runner.observe(loss=0.9, val_loss=1.1, watched=1.1, measured_now=True,
                   progress=Progress(step=40, total_steps=400, budget_used=0.1))
    ```
    """

    def __init__(self, model: keras.Model, policy: AdjustmentPolicy, trigger: Trigger, log: DecisionLog,
                 agreement: WorkerAgreement | None = None, restart_trial: RestartTrial | None = None,
                 charge: Callable[[int, int], None] | None = None) -> None:
        for name, value, kind, text in (("policy", policy, AdjustmentPolicy, "kadapt.meta.AdjustmentPolicy"),
                                        ("trigger", trigger, Trigger, "kadapt.meta.Trigger"),
                                        ("log", log, DecisionLog, "kadapt.meta.live.decision_log.DecisionLog")):
            if not isinstance(value, kind):
                raise TypeError(f"Argument `{name}` must be a {text}. Received: {name}={value!r}")
        self.model, self.policy, self.trigger, self.log = model, policy, trigger, log
        self.agreement = agreement or WorkerAgreement()
        if restart_trial is not None and (not isinstance(restart_trial, RestartTrial) or not callable(charge)):
            raise TypeError("Argument `restart_trial` must be a kadapt.meta.RestartTrial, with a callable `charge`. "
                            f"Received: restart_trial={restart_trial!r}, charge={charge!r}")
        self.restart_trial, self._charge = restart_trial, charge
        # Where it pays (`DeviceObserver.attach`, at the first observation: the steps before it
        # show the device's peak memory), observations are reduced on the device and the rollback
        # points kept there; otherwise the model is read on the host.
        self.observer = None
        self._observer_chosen = False
        self.policy_state = PolicyState()
        self.history = FeatureHistory()
        self.initial_learning_rate = applied_learning_rate(model.optimizer)
        self.range_test_rate = None  # the test's suggestion: a feature of every later observation
        self.rates = None  # (learning rate, momentum) the optimizer applies, as last read
        self.last_good = self.pending = self.start = None
        self._scheduled = []  # the schedule's rate (before the live multiplier) at the last two observations
        if model.trainable_variables:
            self._hold_start()

    def after_step(self, loss: float | None) -> None:
        """After each training step, with its loss (`None`: not logged): holds the start if the
        step just built the model, and gives the start the first loss measured."""
        if self.last_good is None:
            self._hold_start()
        if loss is not None and self.last_good.value == math.inf:
            # The first batch's loss was measured at the initial weights: the reference for
            # "exploded", and the value of the initial state a rollback may return to.
            self.last_good = self.pending = self.start = dataclasses.replace(self.last_good, value=float(loss))
            self.trigger.seed(self.last_good.value)

    def start_from(self, run: RangeTestRun) -> None:
        """Takes a range-test start's outcome: its suggestion, and the rate it set."""
        self.range_test_rate = run.suggestion
        if run.learning_rate is not None and learning_rate_multiplier(self.model.optimizer) is None:
            self.initial_learning_rate = run.learning_rate  # later changes stay within MAX_CHANGE of the found rate
        if run.continued_from is not None:  # the run goes on from a branch's end: a rollback returns there
            self.last_good = self.pending = self.start = rollback.take(self.model)

    def observe(self, loss: float, val_loss: float | None, watched: float, measured_now: bool,
                progress: Progress) -> None:
        """One observation: the history grows a row, the policy decides, the runner executes.

        Args:
            loss: Float. The training loss of the last interval.
            val_loss: Float or `None`. The validation loss, when measured.
            watched: Float. The value the trigger watches (a loss, lower is better).
            measured_now: Bool. Whether `watched` was measured at the weights as
                they are now (a validation loss), not before the interval's
                last updates (a training loss).
            progress: `Progress`. Where the run stands.
        """
        if not self._observer_chosen:
            self._choose_observer()
        # One read of the model (weights, slots, rates) serves the features and the rollback point;
        # or, on the device, the update's sums (the rollback point is then a copy there).
        reading = read_model(self.model) if self.observer is None else self.observer.observe()
        observation = self._observation(loss, val_loss, progress, reading)
        self.history.observe(observation)
        finite = _finite(loss) and _finite(watched) and self.history.weights_finite
        reason = self.agreement.reason(self.trigger.update(watched if finite else math.nan))
        adjustment, self.policy_state = self.policy.decide(
            self.policy_state, self.history.window(), reason, self.rates[0],
            annealing=self._annealing(), final=progress.final, suggestion=self.range_test_rate,
            loss_ratio=self._loss_ratio(watched) if finite else None)
        adjustment = self.agreement.adjustment(adjustment)
        trial = self._judge_restart(adjustment, progress) if adjustment.restart_trial else None
        self._execute(adjustment, watched, finite, measured_now, progress, reading, trial)
        if progress.budget_used > self.policy.restart_within:
            self.start = None  # no restart can come: the initial state is not held longer

    def cut_too_high(self, lower_end: Any, watched: float, progress: Progress) -> tuple[str, TrialResult | None]:
        """The too-high-rate check's cut (`kadapt.meta.live.high_rate`), taken as the policy takes
        a first early cut: from the initial state where the run has kept at least `restart_above`
        of its starting loss, judged (`RestartTrial`) where it kept `trial_above`, else where the
        run is, from the end of the check's branch at the cut rate (`lower_end`, host state that
        `kadapt.batching.training_state.restore` takes). Returns how it was taken, in words, and
        the judged restart's result (or `None`)."""
        ratio = self._loss_ratio(watched)
        early = (not self.policy_state.rate_changed and self.start is not None and ratio is not None
                 and 0.0 < progress.budget_used <= self.policy.restart_within)
        restart = early and ratio >= self.policy.restart_above
        judged = early and not restart and self.restart_trial is not None and ratio >= self.policy.trial_above
        self.policy_state = dataclasses.replace(self.policy_state, rate_changed=True, raised=False)
        cut = Adjustment("high_rate", CUT, consulted=True, restart_trigger=True, restart=restart, restart_trial=judged)
        if not (restart or judged):
            training_state.restore(lower_end)  # the cut rate is set there, the slots built at it
            self.trigger.adjusted()
            self.rates = self.read_rates()
            return "from the branch at the cut rate", None
        trial = self._judge_restart(cut, progress) if judged else None
        self._execute(cut, watched, False, True, progress, None, trial, log=False)
        if trial is None:
            return "from the start", None
        return ("from the start (judged restart taken)" if trial.taken else "here (judged restart not taken)"), trial

    def read_rates(self) -> tuple[float, float]:
        """The learning rate and momentum the optimizer applies now."""
        optimizer = self.model.optimizer
        return applied_learning_rate(optimizer), current_momentum(optimizer)

    def finish(self) -> None:
        """At the end of training: a run never ends on non-finite weights, so back to the last good state."""
        if self.last_good is not None and not _all_finite(self.model.variables):
            rollback.restore(self.model, self.last_good)

    def get_state(self) -> dict[str, Any]:
        """What later decisions depend on, as arrays and JSON values (`kadapt.meta.live.adjuster_state`)."""
        history = self.history.get_state()
        if self.observer is not None:  # the update features' weights are on the device
            history["previous_weights"], history["previous_update"] = self.observer.previous_on_host()
        return {"history": history, "trigger": self.trigger.get_state(),
                "policy": dataclasses.asdict(self.policy_state), "last_good": rollback.to_state(self.last_good),
                "pending": rollback.to_state(self.pending), "start": rollback.to_state(self.start),
                "scheduled": list(self._scheduled),
                "initial_learning_rate": float(self.initial_learning_rate), "range_test_rate": self.range_test_rate}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores what `get_state` returned, for the same model; a `ValueError` for another's."""
        self.last_good = rollback.from_state(state["last_good"], self.model)
        self.pending = rollback.from_state(state["pending"], self.model)
        self.start = rollback.from_state(state.get("start"), self.model)
        self.history.set_state(state["history"])
        if self.observer is not None:
            self.observer.set_previous(*self.history.pop_previous())
        self.trigger.set_state(state["trigger"])
        self.policy_state = PolicyState(**state["policy"])
        self._scheduled = [float(v) for v in state["scheduled"]]
        self.initial_learning_rate = float(state["initial_learning_rate"])
        self.range_test_rate = state.get("range_test_rate")

    def _choose_observer(self):
        """Observes on the device from here on where it pays; the weights the next update is
        measured from (a resumed run's, restored into the history) move there too."""
        self._observer_chosen = True
        self.observer = DeviceObserver.attach(self.model)
        if self.observer is not None:
            self.observer.set_previous(*self.history.pop_previous())

    def _hold_start(self):
        """Takes the first state a rollback can return to. A model that its first `fit` step
        builds (a subclassed model never called before) has no variables before that step, so
        its first state is the one after it."""
        optimizer = self.model.optimizer
        if not optimizer.built:  # as fit would at its first step, so the start can be rolled back to
            optimizer.build(self.model.trainable_variables)
        # Read eagerly: at the start of fit the input pipeline holds TensorFlow's inter-op threads,
        # where a compiled read waits (`read_model`).
        self.last_good = self.pending = self.start = rollback.take(
            self.model, reading=read_model(self.model, compiled=False))

    def _loss_ratio(self, watched):
        """The watched loss over the run's starting loss, while the start is held and its loss known."""
        start = None if self.start is None else self.start.value
        return watched / start if start is not None and 0.0 < start < math.inf else None

    def _judge_restart(self, adjustment, progress) -> TrialResult | None:
        """Trains the judged restart's branch (`RestartTrial.run`); `None` where there is no trial
        to run (no data given, or the start not held). Taken, the model is at the branch's end."""
        if self.restart_trial is None or self.start is None:
            return None
        action = action_lib.ACTIONS[adjustment.action]
        total = progress.total_steps
        trained = progress.step if total is None else round(progress.budget_used * total)  # in this budget
        result = self.restart_trial.run(self.model, self.start, lambda: self._apply(action), trained, total)
        self._charge(result.steps, result.steps if result.taken else 0)
        return result

    def _execute(self, adjustment: Adjustment, watched, finite, measured_now, progress, reading,
                 trial: TrialResult | None = None, log: bool = True):
        """Does what the policy chose: roll back, move the rollback point, apply, log."""
        taken = trial is not None and trial.taken
        if taken:
            # The run goes on from the branch's end: restarted, the cut applied, those steps trained.
            self.last_good = self.pending = self._point(trial.held_branch, None, keep=None)
            self.trigger.rebaseline(trial.held_branch)
            self.rates = self.read_rates()
        elif adjustment.restart or adjustment.rollback:
            # A restart goes back to the initial state (the run starts again at the new rate), a
            # rollback to the last good one.
            point = self.start if adjustment.restart else self.last_good
            rollback.restore(self.model, point, restart_momentum=adjustment.restart or adjustment.restart_momentum)
            self.last_good = self.pending = point
            self.trigger.rebaseline(point.value)
        elif finite:
            self._advance_rollback_point(watched, measured_now, reading)
        if adjustment.consulted and not taken:  # a taken trial's branch trained at the new rate already
            self._apply(action_lib.ACTIONS[adjustment.action])
        if adjustment.restart_trigger:
            self.trigger.adjusted()
        if adjustment.logged and log:
            logged = dataclasses.replace(adjustment, restart=True) if taken else adjustment
            self.log.adjustment(logged, self.history.window(), self.rates, progress.step, progress.epoch,
                                trial=None if trial is None else trial.detail())

    def _advance_rollback_point(self, watched, measured_now, reading):
        if measured_now:
            self.last_good = self.pending = self._point(watched, reading, keep=None)
        else:
            # A training loss was measured before the latest updates: the weights now are
            # confirmed good only by the next observation.
            self.last_good, self.pending = self.pending, self._point(watched, reading, keep=self.pending)

    def _point(self, watched, reading, keep):
        """The rollback point of the state now: a copy into a device buffer that `keep` (a point
        still held) is not in, or host copies from `reading`."""
        if self.observer is None:
            return rollback.take(self.model, watched, reading)
        slot = self.observer.free_slot({keep.slot} if isinstance(keep, rollback.BufferedPoint) else set())
        self.observer.snapshot(slot)
        return rollback.BufferedPoint(self.observer, slot, watched)

    def _apply(self, action):
        action_lib.apply(self.model.optimizer, action, self.initial_learning_rate, self.range_test_rate)
        self.rates = self.read_rates()
        # A float rate the action just set is not the schedule annealing.
        self._scheduled[-1] = _scheduled_rate(self.model.optimizer)

    def _annealing(self):
        """Whether the schedule (the rate before the live multiplier) fell since the last observation."""
        scheduled = self._scheduled
        return len(scheduled) >= 2 and scheduled[-1] < scheduled[-2] * (1 - ANNEALING_TOLERANCE)

    def _observation(self, loss, val_loss, progress, reading) -> Observation:
        self._scheduled = self._scheduled[-1:] + [reading.scheduled_rate]
        observation = observe_model(self.model, progress.step, loss, val_loss, progress.budget_used,
                                    progress.total_steps, self.range_test_rate, reading)
        self.rates = observation.learning_rate, observation.momentum
        return observation


def _scheduled_rate(optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _finite(value):
    return value is not None and math.isfinite(float(value))


def _all_finite(variables):
    return all(bool(np.all(np.isfinite(v.numpy()))) for v in variables)
