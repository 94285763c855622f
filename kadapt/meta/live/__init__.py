"""The live adjuster: the `MetaAdjuster` callback, the policy that decides, the runner that executes.

`adjuster` says when, `policy` decides (pure), `adjustment_runner` executes on
the model; `triggers` say when to consult the meta-model; `restart_trial`
judges a restart; `decision_log` and `adjuster_state` are what it writes and
resumes from; `worker_agreement` keeps every worker on the chief's decision;
`dead_run` (with `chance_loss`) recognises a run left at chance or blown up, and
`dead_run_rescue` acts on it, a part of the adjuster; `fit_rows` samples the rows
fit trains on, from which `derived_parts` builds the parts not given.
"""
