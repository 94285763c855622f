"""Reading a live run: its observation, the host or device reads under it, their cost, rollback points.

`observation` is the one place an `Observation` is read off a model (for the
adjuster and the collector alike), from `host_reads` or, where it pays, the
`device_observer`; `rollback` keeps the state a diverged run returns to;
`observation_cost` judges what watching costs.
"""
