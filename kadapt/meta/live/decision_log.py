"""`DecisionLog`: what the `MetaAdjuster` decided, kept in memory, written as JSON lines, printed.

Each decision is one JSON object with the same leading keys whatever made it:
`step`, `epoch`, `trigger` (the trigger's reason, `"target"` or
`"range_test"`), `adjustment` (the action's changes, `{}` for none), `action`
(what was done, in words), `predicted_gain`, `rollback` and `features` (the
last feature row, rounded). An adjustment adds the rates it left and whether a
considered action was `applied`, and `"restart": true` where the run went back
to its initial state first; a range-test start adds its `range_test` detail.
The file is `log_dir/meta_decisions.jsonl`, appended to line by line and
rewritten whole only when a resumed run restores its decisions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from kadapt.meta.live.policy import Adjustment
from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.features import FEATURE_NAMES

DECISIONS_FILE = "meta_decisions.jsonl"


class DecisionLog:
    """The decisions of one `fit`: a list, a JSON-lines file and (with `verbose`) a printed line each.

    Args:
        log_dir: Path or `None`. Where `meta_decisions.jsonl` is written.
            Defaults to `None` (kept in memory only).
        verbose: Int. 1 prints each decision. Defaults to `1`.

    Example:

    ```python
    log = DecisionLog("runs/a", verbose=0)
    log.begin()
    log.target_reached("val_loss", 0.09, step=120, epoch=5)
    log.decisions[-1]["action"]  # "stop"
    ```
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, verbose: int = 1) -> None:
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.verbose = verbose
        self.decisions = []
        self.count_this_epoch = 0

    def begin(self) -> None:
        """Starts a `fit`: no decisions yet, and the file exists (empty) in `log_dir`."""
        self.decisions, self.count_this_epoch = [], 0
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            (self.log_dir / DECISIONS_FILE).touch()

    def begin_epoch(self) -> None:
        """Starts counting the decisions of a new epoch (the epoch logs' `meta_adjustments`)."""
        self.count_this_epoch = 0

    def write(self, decision: dict[str, Any]) -> None:
        """Keeps `decision`, appends it to the file and prints it."""
        self.decisions.append(decision)
        self.count_this_epoch += 1
        if self.log_dir is not None:
            with open(self.log_dir / DECISIONS_FILE, "a") as file:
                file.write(json.dumps(decision) + "\n")
        if self.verbose:
            gain = decision["predicted_gain"]
            print(f"\nMetaAdjuster step {decision['step']}: {decision['trigger']} -> {decision['action']}"
                  + ("" if gain is None else f" (predicted gain {gain:+.3f})"), flush=True)

    def restore(self, decisions: list[dict[str, Any]]) -> None:
        """Holds exactly `decisions` (a resumed run's), the file rewritten to them whole."""
        self.decisions = list(decisions)
        if self.log_dir is not None:
            lines = "".join(json.dumps(decision) + "\n" for decision in self.decisions)
            aside = self.log_dir / (DECISIONS_FILE + ".partial")
            aside.write_text(lines)
            os.replace(aside, self.log_dir / DECISIONS_FILE)

    def adjustment(self, adjustment: Adjustment, window: np.ndarray, rates: tuple[float, float],
                   step: int, epoch: int, trial: dict[str, Any] | None = None) -> None:
        """Writes the policy's `adjustment` at an observation, with the window's last row and
        the learning rate and momentum it left; `trial`: a judged restart's branch and scores
        (`kadapt.meta.live.restart_trial.TrialResult.detail`)."""
        decision = {"step": step, "epoch": epoch, "trigger": adjustment.reason,
                    "adjustment": dict(action_lib.ACTIONS[adjustment.action]), "action": adjustment.text,
                    "predicted_gain": round(adjustment.gain, 4), "rollback": adjustment.rollback,
                    "features": _summary(window), "learning_rate": rates[0], "momentum": rates[1]}
        if adjustment.consulted:
            decision["applied"] = not adjustment.abstained
        if adjustment.restart:
            decision["restart"] = True
        if trial is not None:
            decision["restart_trial"] = trial
        self.write(decision)

    def target_reached(self, monitor: str, value: float, step: int, epoch: int) -> None:
        """Writes the stop at `target`: `monitor` reached it with `value`."""
        self.write({"step": step, "epoch": epoch, "trigger": "target", "adjustment": {}, "action": "stop",
                    "predicted_gain": None, "rollback": False, "features": {monitor: value}})

    def high_rate(self, action: str, detail: dict[str, Any], rates: tuple[float, float], step: int,
                  epoch: int, trial: dict[str, Any] | None = None) -> None:
        """Writes a too-high-rate check: `action` (`"keep"` or the cut and where it was taken), its
        branches' held losses (`HighRateReading.detail`), the rates it left and, where the cut was a
        judged restart, its branch and scores (`TrialResult.detail`)."""
        decision = {"step": step, "epoch": epoch, "trigger": "high_rate", "adjustment": {}, "action": action,
                    "predicted_gain": None, "rollback": False, "features": {}, "high_rate": detail,
                    "learning_rate": rates[0], "momentum": rates[1]}
        if trial is not None:
            decision["restart_trial"] = trial
        self.write(decision)

    def range_test(self, action: str, detail: dict[str, Any], step: int, epoch: int) -> None:
        """Writes a range-test start: `action` (`"keep"` or the rate's move) and what the test found."""
        self.write({"step": step, "epoch": epoch, "trigger": "range_test", "adjustment": {}, "action": action,
                    "predicted_gain": None, "rollback": False, "features": {}, "range_test": detail})


def _summary(window):
    return {name: round(float(value), 4) for name, value in zip(FEATURE_NAMES, window[-1])}
