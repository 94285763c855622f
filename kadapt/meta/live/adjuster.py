"""`MetaAdjuster`: the meta-model adjusts the live optimizer inside `model.fit`."""

from __future__ import annotations

import copy
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kadapt.meta.live import derived_parts
from kadapt.meta.live.adjuster_state import load_state
from kadapt.meta.live.adjuster_state import save_state
from kadapt.meta.live.adjustment_runner import AdjustmentRunner
from kadapt.meta.live.adjustment_runner import Progress
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.meta.live.dead_run_rescue import DeadRunRescue
from kadapt.meta.live.decision_log import DECISIONS_FILE  # noqa: F401  (still importable from here)
from kadapt.meta.live.decision_log import DecisionLog
from kadapt.meta.live.fit_rows import FitRows
from kadapt.meta.live.high_rate import HighRateCheck
from kadapt.meta.live.policy import AdjustmentPolicy
from kadapt.meta.live.policy import RESTART_WITHIN
from kadapt.meta.live.policy import model_predictor
from kadapt.meta.live.restart_trial import RestartTrial
from kadapt.meta.live.triggers import Trigger
from kadapt.meta.live.worker_agreement import WorkerAgreement
from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.features import FeatureHistory
from kadapt.meta.model.meta_model import MIN_CUT_GAIN
from kadapt.meta.model.meta_model import MIN_GAIN
from kadapt.meta.model.meta_model import check_spec
from kadapt.meta.model.meta_model import load_meta_model
from kadapt.meta.observe.observation_cost import ObservationCost
from kadapt.meta.start.range_test_run import run_range_test
from kadapt.meta.start.range_test_start import RangeTestStart
from kadapt.validation import check_range

STATE_FILE = "meta-adjuster-epoch-{epoch}.npz"  # in `backup_dir`; the last two epochs are kept
# The default trigger also consults the meta-model after this many observations without an
# adjustment: the records branch at fixed points (every 3 epochs), and a run far too low improves
# steadily, never "slow" (held-out figures: benchmarks/README.md#meta_rescue).
CONSULT_EVERY = 3


class MetaAdjuster(keras.callbacks.Callback):
    """Watches the loss and lets a meta-model adjust the learning rate and momentum mid-fit.

    One callback holds everything `kadapt train` tunes itself with: the
    meta-model's adjustments (below), the dead-run rescue of a run left at
    chance or diverged (`kadapt.meta.DeadRunRescue`, a part of it: `rescue`),
    the judged restart (`restart_trial`), one decision log and one state to
    resume from. Keras shows a callback none of fit's data, so where the
    rescue's chance level, its range test or the restart's rows are not
    given, they are derived from a uniform sample of the rows fit trains on
    in its first epoch (`kadapt.meta.live.fit_rows.FitRows`: the train
    function is wrapped for that epoch, the model's step untouched): the
    chance level is the compiled loss of the best constant prediction on the
    sampled targets (`compiled_chance_loss`: Keras' cross-entropies, mean
    squared and mean absolute errors). Where a part cannot be derived (a
    custom loss, rows that are not arrays of numbers), it is off and one
    line says which and how to turn it on. The parts act at each epoch end
    after the meta-model's decision, the rescue last: its rollback has the
    last word.

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

    A rate set far too high from the first step can leave a network that a cut
    no longer brings back (units dead, outputs saturated). So where the run's
    first change of the rate is a cut on a stall (plateau, slow progress,
    oscillation), within the first 30% of the budget, and the watched loss
    is still at least 0.75 of the first step's, the run goes back to its
    initial weights, the optimizer's slots zeroed, and starts again at the
    cut rate (`restart`; the decision's action reads "lr x0.1, from the
    start"). Such a run has little progress to lose; one that has learned
    (its loss below 0.75 of the start) keeps its weights.

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

    The decision itself is `kadapt.meta.live.policy.AdjustmentPolicy`'s, a pure
    object fed the window, the rate and the trigger's reason; an
    `AdjustmentRunner` (`kadapt.meta.live.adjustment_runner`) executes it
    (rollback, action, log), and the callback tells it when. With
    `backup_dir` (the directory of the run's `BackupAndRestore`) its whole
    state — history, trigger, rollback points, ceiling, decisions — is saved
    there at every epoch end and restored when a resumed `fit` begins its
    first epoch, so the resumed run adjusts as the uninterrupted one would.

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
        meta_model: `"default"`, the path of a `.keras` meta-model, a loaded
            one, or `None`: no adjustments, the rescue and `target` only
            (`kadapt train --meta off`). Defaults to `"default"`.
        monitor: String. The loss or metric of the logs to watch and compare
            with `target`. Defaults to `"val_loss"`.
        target: Float or `None`. Stop when `monitor` reaches it. Defaults to `None`.
        mode: `"min"`, `"max"` or `"auto"` (max for accuracy-like names).
        check_every: `"epoch"` or a positive int of steps. Defaults to `"epoch"`.
        trigger: `kadapt.meta.Trigger` or `None`: its defaults, consulting the
            meta-model every `CONSULT_EVERY` (3) observations without an adjustment
            as well (`Trigger(consult_every=3)`).
        log_dir: Path or `None`. Where `meta_decisions.jsonl` is written.
        verbose: Int. 1 prints each decision. Defaults to `1`.
        min_gain: Float >= 0. The predicted gain (log of the final validation
            loss keeping would reach over the one the action would) an action
            needs to be applied; below it the adjuster keeps, and logs what it
            considered. Defaults to `0.1` (about 10% lower). After a
            divergence a cut is applied whatever its predicted gain; after
            a raise (no cut or divergence since) a further raise needs only
            `kadapt.meta.model.meta_model.FOLLOW_GAIN` (0.005).
        backup_dir: Path-like or `None`. Where the state lives between an
            interrupted run and its resume (`get_state`, as `.npz`). Defaults
            to `None` (kept in memory only).
        range_test: `kadapt.meta.RangeTestStart` or `None`. The range test
            to start from. Defaults to `None` (none).
        min_cut_gain: Float >= 0. The predicted gain a learning-rate cut
            needs, where the best action is one (never more than
            `min_gain`): a cut's downside is a slower run, not an unstable
            one. Defaults to `0.03` (about 3% lower).
        restart: Bool. Whether a first early cut of a run stalled near its
            starting loss starts the run again from its initial state
            (above). Defaults to `True`.
        restart_trial: `kadapt.meta.RestartTrial` or `None`. The data on which
            a first early cut of a run that learned a little (or one a
            scheduled consultation chose) is judged: a branch from the initial
            state at the cut rate trains as many steps as the run has (at most
            a tenth of the budget), and the run restarts from the branch's end
            only where the branch's held loss is lower than the run's now;
            else the cut applies where the run is, the branch's steps charged
            to the budget. The decision log writes both losses under
            `"restart_trial"`. Not under a multi-worker strategy; none with
            `restart=False`. `"auto"`: on the sampled rows of fit's first
            epoch (the held rows among them: rows the run trained on, so the
            comparison leans to the run), off under a multi-worker strategy.
            `None`: such a cut applies where the run is. Defaults to `"auto"`.
        rescue: Bool or `kadapt.meta.DeadRunRescue`. The dead-run rescue as a
            part: `True` builds one on the compiled loss's chance level and a
            range test on the sampled rows, a `DeadRunRescue` (without a
            `log_dir` or `backup_dir` of its own) is used as given, `False`
            turns it off. The one built here is off under a multi-worker
            strategy (said once), as in `kadapt train`. Defaults to `True`.
        chance_loss: Positive float or `None`. The loss of the best constant
            prediction, for the rescue's at-chance rule where it cannot be
            derived (a custom loss); `None` derives it. Defaults to `None`.
        high_rate: `kadapt.meta.HighRateCheck`, `"auto"` or `None`. The check
            for a rate too high that still trains
            (`kadapt.meta.live.high_rate`): at its epoch ends (the 2nd and
            4th), where nothing else changed the rate there, the run and a
            branch at a tenth of its rate train one epoch's steps (at most 5%
            of the budget) from a snapshot; where two checks in a row find
            the tenth's held loss below 0.7x the live rate's, the rate is cut
            x0.1 as the policy's first early cut is (from the start, judged,
            or where the run is); else the run goes on from its own branch.
            The other branch's steps are charged to the budget. `"auto"`: on
            the sampled rows of fit's first epoch, off under a multi-worker
            strategy. Off by default: on the held-out families it did not
            help (benchmarks/README.md#meta_rescue). Defaults to `None`.

    Example:

    ```python
    model.compile(optimizer=kadapt.optimizers.SGD(0.5, momentum=0.9), loss="sparse_categorical_crossentropy")
    model.fit(x, y, validation_split=0.2, epochs=20,
              callbacks=[kadapt.MetaAdjuster(log_dir="runs/a")])
    ```
    """

    def __init__(self, meta_model: str | os.PathLike | keras.Model | None = "default", monitor: str = "val_loss",
                 target: float | None = None, mode: str = "auto", check_every: str | int = "epoch",
                 trigger: Trigger | None = None, log_dir: str | os.PathLike | None = None, verbose: int = 1,
                 min_gain: float = MIN_GAIN, backup_dir: str | os.PathLike | None = None,
                 range_test: RangeTestStart | None = None, min_cut_gain: float = MIN_CUT_GAIN,
                 restart: bool = True, restart_trial: RestartTrial | str | None = "auto",
                 rescue: bool | DeadRunRescue = True, chance_loss: float | None = None,
                 high_rate: HighRateCheck | str | None = None) -> None:
        super().__init__()
        if not isinstance(restart, bool):
            raise TypeError(f"Argument `restart` must be True or False. Received: restart={restart!r}")
        self.restart = restart
        check_range("min_gain", min_gain, low=0.0)
        check_range("min_cut_gain", min_cut_gain, low=0.0)
        self.min_gain, self.min_cut_gain = float(min_gain), float(min_cut_gain)
        self.meta_model = None if meta_model is None else _load(meta_model)
        # Reads the meta-model's weights once: they do not change.
        self._predict = None if self.meta_model is None else model_predictor(self.meta_model)
        self.monitor, self.target = _check_monitor(monitor), _check_target(target)
        self.mode = _check_mode(mode, monitor)
        if check_every != "epoch":
            check_range("check_every", check_every, low=1, integer=True)
        self.check_every = check_every
        if trigger is not None and not isinstance(trigger, Trigger):
            raise TypeError(f"Argument `trigger` must be a kadapt.meta.Trigger or None. Received: trigger={trigger!r}")
        self._trigger_template = trigger or Trigger(consult_every=CONSULT_EVERY)
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.backup_dir = None if backup_dir is None else Path(backup_dir)
        self.verbose = verbose
        if range_test is not None and not isinstance(range_test, RangeTestStart):
            raise TypeError("Argument `range_test` must be a kadapt.meta.RangeTestStart or None. "
                            f"Received: range_test={range_test!r}")
        if range_test is not None and self.meta_model is None:
            raise ValueError("Argument `range_test` starts the meta-model's run, and there is none: pass a "
                             "meta_model, or range_test=None. Received: meta_model=None")
        self.range_test = range_test
        if restart_trial != "auto" and restart_trial is not None and not isinstance(restart_trial, RestartTrial):
            raise TypeError("Argument `restart_trial` must be \"auto\", a kadapt.meta.RestartTrial or None. "
                            f"Received: restart_trial={restart_trial!r}")
        self.restart_trial = restart_trial if restart and self.meta_model is not None else None
        if chance_loss is not None:
            check_range("chance_loss", chance_loss, low=0.0, low_open=True)
        self.chance_loss = chance_loss
        if high_rate != "auto" and high_rate is not None and not isinstance(high_rate, HighRateCheck):
            raise TypeError("Argument `high_rate` must be \"auto\", a kadapt.meta.HighRateCheck or None. "
                            f"Received: high_rate={high_rate!r}")
        self.high_rate = high_rate if self.meta_model is not None else None
        self.rescue, self._rescue_is_own = _check_rescue(rescue, self.monitor, verbose), rescue is True
        self.decision_log = DecisionLog(self.log_dir, verbose)
        if self.rescue is not None:
            self.rescue.decision_log = self.decision_log

    def __deepcopy__(self, memo):
        # KerasTuner deep-copies callbacks per trial: share the (read-only) meta-model.
        clone = copy.copy(self)
        clone._trigger_template = copy.deepcopy(self._trigger_template, memo)
        clone.decision_log = DecisionLog(self.log_dir, self.verbose)
        if self.rescue is not None:  # its own, writing to the clone's log (it holds the model: not deep)
            clone.rescue = copy.copy(self.rescue)
            clone.rescue.decisions, clone.rescue.decision_log = [], clone.decision_log
        return clone

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        if self.rescue is not None:
            self.rescue.set_model(model)

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params(params)
        if self.rescue is not None:
            self.rescue.set_params(params)

    @property
    def decisions(self) -> list[dict[str, Any]]:
        """The decisions of the current (or last) `fit`, as written to `log_dir/meta_decisions.jsonl`."""
        return self.decision_log.decisions

    @property
    def policy(self) -> AdjustmentPolicy:
        """The policy deciding at each observation, once training began."""
        return self._runner.policy

    @property
    def history(self) -> FeatureHistory:
        """The run's feature history (`kadapt.meta.features`), once training began."""
        return self._runner.history

    @property
    def trigger(self) -> Trigger:
        """This run's trigger (a copy of the one given), once training began."""
        return self._runner.trigger

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.decision_log.begin()
        self._began, self._epoch = False, 0
        self._step = int(self.model.optimizer.iterations.numpy())
        self._interval_start = (0, 0.0)
        self._last_epoch_ending = False
        self._range_tested, self._range_test_steps = self.range_test is None, 0
        self._outside_steps = 0  # trained outside fit's loop: a range test's, branches', a restart trial's
        self._budget_base = 0  # the steps counted before this fit's budget (set at its first epoch)
        self._cost = None if self.check_every == "epoch" else ObservationCost(self.check_every)
        self._observed_at = None  # when the last step-mode observation ended (`time.perf_counter`)
        self._derives_trial = self.restart_trial == "auto"
        self._high_rate, self._derives_high_rate = self._high_rate_part()
        self._high_rate_below = 0  # the checks in a row that read the rate too high, since the last move
        self._runner = None if self.meta_model is None else self._begin_adjusting()
        self._part = self._rescue_part()
        if self._part is not None:
            self._part.on_train_begin(logs)
        self._fit_rows = None
        if self._derives_rule() or self._derives_range_test() or self._derives_trial or self._derives_high_rate:
            # Seeded from NumPy's global generator: `keras.utils.set_random_seed` makes it repeat.
            self._seed = int(np.random.randint(2**31))
            self._fit_rows = FitRows(seed=self._seed)
            self._fit_rows.tap(self.model)

    def _begin_adjusting(self):
        """The runner of the meta-model's adjustments for this fit."""
        optimizer = self.model.optimizer
        allowed = action_lib.optimizer_mask(optimizer)
        if not allowed[[i for i in range(len(allowed)) if i != action_lib.KEEP]].any():
            raise ValueError(
                f"MetaAdjuster cannot change anything on optimizer {type(optimizer).__name__}: its "
                "learning rate is a schedule without a live multiplier and its momentum is a "
                "constant. Use kadapt.optimizers.SGD or kadapt.optimizers.Adam (live multiplier "
                "and momentum), or a float learning rate.")
        policy = AdjustmentPolicy(self._predict, allowed, self.min_gain, self._trigger_template.patience,
                                  self.min_cut_gain, restart_within=RESTART_WITHIN if self.restart else 0.0)
        agreement = WorkerAgreement.of(self.model)
        if self._derives_trial and agreement.strategy is not None:
            self._derives_trial = False
            warnings.warn(derived_parts.RESTART_OFF.format(why="each worker of a multi-worker strategy would judge "
                                                                "on its own rows"), RuntimeWarning, stacklevel=2)
        if isinstance(self.restart_trial, RestartTrial) and agreement.strategy is not None:
            raise ValueError("Argument `restart_trial` cannot judge a restart under a multi-worker strategy: "
                             "each worker would train and score the branch on its own rows. Received: "
                             f"restart_trial={self.restart_trial!r}. Pass restart_trial=None in a multi-worker job.")
        trial = self.restart_trial if isinstance(self.restart_trial, RestartTrial) else None
        return AdjustmentRunner(self.model, policy, copy.deepcopy(self._trigger_template),
                                self.decision_log, agreement, trial, self._charge)

    def _high_rate_part(self):
        """`(check, derives)`: the too-high-rate check given, or one to derive from fit's rows
        (`"auto"`; off, said once, under a multi-worker strategy)."""
        if self.high_rate != "auto":
            if isinstance(self.high_rate, HighRateCheck) and WorkerAgreement.of(self.model).strategy is not None:
                raise ValueError("Argument `high_rate` cannot branch under a multi-worker strategy: each worker "
                                 "would train and score the branches on its own rows. Pass high_rate=None.")
            return self.high_rate, False
        if WorkerAgreement.of(self.model).strategy is not None:
            warnings.warn(derived_parts.HIGH_RATE_OFF.format(why="each worker of a multi-worker strategy would "
                                                                 "judge on its own rows"), RuntimeWarning, stacklevel=3)
            return None, False
        return None, True

    def _rescue_part(self):
        """The rescue part for this fit; its own derived afresh from this fit's rows, and off (said
        once) under a multi-worker strategy, where each worker would act on its own rows."""
        if self.rescue is None or not self._rescue_is_own:
            return self.rescue
        if WorkerAgreement.of(self.model).strategy is not None:
            warnings.warn(derived_parts.RESCUE_OFF, RuntimeWarning, stacklevel=3)
            return None
        self.rescue.rule = None if self.chance_loss is None else DeadRunRule(self.chance_loss)
        self.rescue.range_test = None
        return self.rescue

    def _derives_rule(self):
        return self._part is not None and self._part.rule is None

    def _derives_range_test(self):
        return self._part is not None and self._rescue_is_own

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._began:
            self._began = True
            self._resume(epoch)
            # The budget (`epochs x steps`) counts from this fit's first step, or, resumed at a
            # later epoch, from the run's: a second `fit` starts with the first's steps counted.
            self._budget_base = self._step if epoch == 0 else 0
        self._last_epoch_ending = False
        self._epoch, self._interval_start = epoch, (0, 0.0)
        self._observed_at = None  # the epoch before ended in validation: not the steps' time
        self.decision_log.begin_epoch()
        self._epoch_start_step = self._step
        if self._part is not None:
            self._part.on_epoch_begin(epoch, logs)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Here rather than at train begin: fit has built the model and optimizer by now, and on
        # JAX it reads the variables into its state after the first batch's begin.
        if not self._range_tested:
            self._range_tested = True
            self._start_from_range_test()
        if self._part is not None:  # after the range test: the rescue's initial point is where the run starts
            self._part.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Counted here rather than read from `iterations`, which would cost a device sync per step.
        self._step = self._epoch_start_step + batch + 1
        if self._outside_steps and self._step - self._budget_base >= (self._total_steps() or math.inf):
            self.model.stop_training = True  # steps trained outside fit count to the budget
        if self._part is not None:
            self._part.on_train_batch_end(batch, logs)
        if self._runner is None:
            return
        self._runner.after_step(float(logs["loss"]) if logs and "loss" in logs else None)
        if not logs or "loss" not in logs:
            return
        if self.check_every == "epoch" or self._step % self.check_every:
            return
        seen = batch + 1
        total = float(logs["loss"]) * seen
        start_seen, start_total = self._interval_start
        self._interval_start = (seen, total)
        loss = (total - start_total) / max(seen - start_seen, 1)
        started = time.perf_counter()
        self._runner.observe(loss, None, loss, measured_now=False, progress=self._progress())
        self._watch_cost(started, time.perf_counter())

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs if logs is not None else {}
        if self._fit_rows is not None:
            self._derive_parts()
        if self.monitor not in logs:
            raise ValueError(
                f"MetaAdjuster monitors `{self.monitor}`, which is not in the epoch logs "
                f"({sorted(logs)}). Pass validation data to fit, or monitor one of those.")
        if self._runner is None:
            self._check_target(float(logs[self.monitor]))
        else:
            self._adjust_at_epoch_end(epoch, logs)
            self._check_high_rate(epoch, logs)
        if self._part is not None:  # last: a rescue's rollback has the last word
            self._part.on_epoch_end(epoch, logs)
        if self.backup_dir is not None:
            self._save(epoch + 1)

    def _adjust_at_epoch_end(self, epoch, logs):
        """The meta-model's observation at an epoch end, and the rates it leaves in the logs."""
        loss = float(logs.get("loss", math.nan))
        observed = self.check_every == "epoch" or not _finite(loss)
        self._last_epoch_ending = epoch + 1 >= (self.params.get("epochs") or math.inf)
        self._check_target(float(logs[self.monitor]))
        if observed:
            name = self.monitor if self.mode == "min" else "val_loss"
            watched = float(logs[name]) if name in logs else loss
            # A validation value is measured at the weights as they are now.
            self._runner.observe(loss, logs.get("val_loss"), watched,
                                 measured_now=name in logs and name.startswith("val_"), progress=self._progress())
        rates = self._runner.rates if observed else self._runner.read_rates()
        logs["meta_learning_rate"], logs["meta_momentum"] = rates
        logs["meta_adjustments"] = self.decision_log.count_this_epoch

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._fit_rows is not None:  # fit ended within its first epoch
            self._fit_rows.untap()
            self._fit_rows = None
        if self._runner is not None:
            self._runner.finish()
        if self._part is not None:
            self._part.on_train_end(logs)

    def _derive_parts(self):
        """At the first epoch's end: the parts not given, from the rows fit trained on in it
        (`derived_parts`); one line for each that is off."""
        rows, self._fit_rows = self._fit_rows, None
        rows.untap()
        lines = []
        if self._derives_rule():
            self._part.rule, line = derived_parts.chance_rule(self.model.loss, rows)
            lines.append(line)
        if self._derives_range_test():
            self._part.range_test = derived_parts.range_test(rows, self._seed)
        if self._derives_trial and self._runner is not None:
            self._runner.restart_trial, line = derived_parts.restart_trial(rows, self._seed)
            lines.append(line)
        if self._derives_high_rate:
            self._high_rate, line = derived_parts.high_rate_check(rows, self._seed)
            lines.append(line)
        for line in filter(None, lines):
            warnings.warn(line, RuntimeWarning, stacklevel=3)

    def _check_high_rate(self, epoch, logs):
        """At the check's epoch ends, where nothing changed the rate at this one and the run goes
        on: both branches (`HighRateCheck.run`), their steps counted, the other branch's charged."""
        check = self._high_rate
        if (check is None or epoch + 1 not in check.epochs or self._rate_changed_this_epoch()
                or self._is_final() or not _finite(logs.get("loss"))):
            return
        steps = check.num_steps(self.params.get("steps"), self._total_steps())
        if not steps:  # off for this fit, said once
            self._high_rate = None
            warnings.warn(derived_parts.HIGH_RATE_OFF.format(why=derived_parts.HIGH_RATE_SHORT.format(
                share=check.share)), RuntimeWarning, stacklevel=3)
            return
        reading, lower_end = check.run(self.model, steps, self._high_rate_below)
        self._high_rate_below = 0 if reading.moved or not reading.below else self._high_rate_below + 1
        action, how, trial = "keep", None, None
        if reading.moved:
            name = self.monitor if self.mode == "min" else "val_loss"
            watched = float(logs.get(name, logs["loss"]))
            how, trial = self._runner.cut_too_high(lower_end, watched, self._progress())
            action = f"lr x0.1, {how}"
        # The run goes on from the end of a branch (the live one's where it finished, or the cut's
        # where it is taken where the run is): those steps are its own, the other branch's charged.
        on_a_branch = how == "from the branch at the cut rate" or (how is None and math.isfinite(reading.live))
        self._charge(2 * reading.steps, reading.steps if on_a_branch else 0)
        rates = self._runner.read_rates()
        self.decision_log.high_rate(action, reading.detail(), rates, self._step, epoch,
                                    trial=None if trial is None else trial.detail())
        logs["meta_learning_rate"], logs["meta_momentum"] = rates
        logs["meta_adjustments"] = self.decision_log.count_this_epoch

    def _rate_changed_this_epoch(self):
        """Whether a decision at this epoch rolled back or applied a change (not a "keep")."""
        decisions = self.decisions[len(self.decisions) - self.decision_log.count_this_epoch:]
        return any(d["rollback"] or (d["adjustment"] and d.get("applied", True)) for d in decisions)

    def _watch_cost(self, started, ended):
        """Feeds the observation's wall time and that of the steps before it (within one epoch:
        an epoch's end runs validation between) to the cost rule; warns once where it advises."""
        if self._observed_at is not None and self._cost is not None:
            self._cost.add(ended - started, started - self._observed_at)
            advice = self._cost.advice()
            if advice is not None:
                warnings.warn(advice, RuntimeWarning, stacklevel=2)
                self._cost = None
        self._observed_at = ended

    def _start_from_range_test(self):
        """Runs the range test, charges its steps, and moves the rate as the start's judge rules."""
        run = run_range_test(self.range_test, self.model, self._total_steps())
        self._charge(run.steps, run.kept)
        self._runner.start_from(run)
        self.decision_log.range_test(run.action, run.detail, self._step, self._epoch)

    def _charge(self, steps, kept=0):
        """Counts `steps` trained outside fit's loop (a range test's and branches' before the first
        step, a restart trial's); all but `kept` of them were undone (the test's, the branches not
        continued, a trial's branch not taken): those are charged to the budget."""
        self._range_test_steps += steps - kept
        self._outside_steps += steps
        self._step += steps
        self._epoch_start_step += steps

    def _total_steps(self):
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        return epochs * steps if epochs and steps else None

    def _progress(self):
        """Where the run stands now, for the runner's observation."""
        return Progress(self._step, self._epoch, self._total_steps(), self._budget_used(), self._is_final())

    def _is_final(self):
        """Whether this observation is the last of the run."""
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        if self.model.stop_training:
            return True
        if epochs and steps:
            return self._step - self._budget_base >= epochs * steps
        return self._last_epoch_ending

    def _budget_used(self):
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        if epochs and steps:
            return min((self._step - self._budget_base) / (epochs * steps), 1.0)
        return min(self._epoch / epochs, 1.0) if epochs else 0.0

    def get_state(self) -> dict[str, Any]:
        """Everything the adjuster's later decisions depend on, as arrays and JSON values.

        The feature history, the trigger's losses and cooldown, the policy's
        ceiling and divergence count, the two rollback points (weights and
        optimizer slots), the schedule's last rates, the initial rate and the
        decisions so far. Call it while training (after `on_train_begin`).
        """
        state = {} if self._runner is None else self._runner.get_state()
        if self._part is not None:
            state["rescue"] = self._part.get_state()
        return {**state, "range_test_steps": self._range_test_steps,
                "outside_steps": self._outside_steps, "high_rate_below": self._high_rate_below,
                "decisions": copy.deepcopy(self.decisions)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores what `get_state` returned, into the running `fit` of the same model.

        The decision log (`log_dir/meta_decisions.jsonl`) is rewritten to hold
        exactly the restored decisions.
        """
        if self._runner is not None:
            self._runner.set_state(state)
        if self._part is not None:
            if "rescue" not in state:
                raise ValueError("The MetaAdjuster state holds no dead-run rescue's, and this adjuster has one: it "
                                 "was saved with rescue=False. Resume with the same arguments, or start afresh.")
            self._part.set_state(state["rescue"])
        # A resumed run does not test again: its rate was set by the first run's test.
        self._range_tested, self._range_test_steps = True, int(state.get("range_test_steps", 0))
        self._outside_steps = int(state.get("outside_steps", self._range_test_steps))
        self._high_rate_below = int(state.get("high_rate_below", 0))
        self.decision_log.restore(state["decisions"])

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
            self.decision_log.target_reached(self.monitor, value, self._step, self._epoch)


def _load(meta_model):
    if isinstance(meta_model, keras.Model):
        check_spec(meta_model)
        return meta_model
    if isinstance(meta_model, (str, Path)):
        return load_meta_model(meta_model)
    raise TypeError(f"Argument `meta_model` must be \"default\", a .keras path or a keras.Model. "
                    f"Received: meta_model={meta_model!r}")


def _check_rescue(rescue, monitor, verbose):
    """The rescue part: `True` builds one (its rule and range test derived at the first epoch
    end), a `DeadRunRescue` is taken as it is, `False` or `None` is none."""
    if rescue is True:
        return DeadRunRescue(None, monitor="val_loss" if monitor.startswith("val_") else "loss", verbose=bool(verbose))
    if rescue is False or rescue is None:
        return None
    if not isinstance(rescue, DeadRunRescue):
        raise TypeError("Argument `rescue` must be True, False or a kadapt.meta.DeadRunRescue. "
                        f"Received: rescue={rescue!r}")
    if rescue.log_dir is not None or rescue.backup_dir is not None:
        raise ValueError("Argument `rescue` must have no log_dir or backup_dir of its own: as a part of the "
                         "MetaAdjuster it writes to the adjuster's decision log and state. Received: "
                         f"log_dir={rescue.log_dir}, backup_dir={rescue.backup_dir}")
    return rescue


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
