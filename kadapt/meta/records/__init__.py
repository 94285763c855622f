"""Adjustment records and the meta-model's training: the tasks, the collector, the store, the search.

`collect` branches short runs of `tasks` and appends what each candidate did to
a `record_store` (its schema and checks in `store_format`, the collectors' lease
queue in `task_leases`); `train` searches the meta-model on those records.
"""
