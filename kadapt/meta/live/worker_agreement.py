"""`WorkerAgreement`: every worker of a multi-worker job adjusts as the chief decides.

Under `tf.distribute.MultiWorkerMirroredStrategy` each worker runs its own
`MetaAdjuster`. The logs they see are synchronized, yet a worker on other
hardware could round a threshold differently, and every worker must act at
the same observation and apply the same action. So at each observation every
worker takes the chief's trigger reason, and then the chief's chosen action:
one small all-gather each (`kadapt.batching.tensorflow.multi_worker.chief_values`).
In one process (any other strategy, or the JAX backend) both are the worker's own.
"""

from __future__ import annotations

import dataclasses

import keras

from kadapt.meta.live.policy import Adjustment

REASONS = (None, "divergence", "plateau", "oscillation", "slow_progress", "scheduled")  # Trigger.update's answers


class WorkerAgreement:
    """The chief's trigger reason and action, on every worker of a multi-worker job.

    Args:
        strategy: A `tf.distribute.MultiWorkerMirroredStrategy` spanning
            several processes, or `None` (one process: every answer is the
            worker's own). Defaults to `None`.

    Example:

    ```python
    agreement = WorkerAgreement.of(model)
    reason = agreement.reason(trigger.update(loss))
    adjustment = agreement.adjustment(policy.decide(state, window, reason, rate)[0])
    ```
    """

    def __init__(self, strategy=None) -> None:
        self.strategy = strategy

    @classmethod
    def of(cls, model: keras.Model) -> WorkerAgreement:
        """The agreement of `model`'s workers: its `MultiWorkerMirroredStrategy` spanning several
        processes, else one process. Only the TensorFlow backend has one (imported only there)."""
        if keras.backend.backend() != "tensorflow":
            return cls()
        from kadapt.batching.tensorflow.multi_worker import in_multi_worker_mode

        strategy = model.distribute_strategy
        return cls(strategy if in_multi_worker_mode(strategy) else None)

    def reason(self, reason: str | None) -> str | None:
        """`reason`, or in a multi-worker job the chief's: every worker must act at the same observation."""
        if self.strategy is None:
            return reason
        (code,) = self._from_chief(REASONS.index(reason))
        return REASONS[int(code)]

    def adjustment(self, adjustment: Adjustment) -> Adjustment:
        """`adjustment`, or in a multi-worker job with the chief's action: every worker applies
        the same one at this step."""
        if self.strategy is None or not adjustment.consulted:
            return adjustment
        index, gain, considered, restart = self._from_chief(adjustment.action, adjustment.gain,
                                                            adjustment.considered, adjustment.restart)
        return dataclasses.replace(adjustment, action=int(index), gain=gain, considered=int(considered),
                                   restart=bool(restart))

    def _from_chief(self, *values):
        from kadapt.batching.tensorflow.multi_worker import chief_values

        return chief_values(self.strategy, [float(v) for v in values])
