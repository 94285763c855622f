"""The run's start: a learning-rate range test before the first step, and the branches that judge it.

`range_test_start` is the configuration, `range_test_run` runs it on the model,
`start_judge` decides between rates from `branch_trials` (short branches from
one snapshot, scored on held batches).
"""
