"""`kadapt meta collect|train|eval`: the meta-model pipeline from the command line."""

import argparse
import json

from kadapt.run.errors import UsageError


def add_meta_arguments(subparsers) -> None:
    parser = subparsers.add_parser("meta", description=__doc__, help="collect records, train or judge a meta-model")
    commands = parser.add_subparsers(dest="meta_command", required=True)
    collect = commands.add_parser("collect", help="branching-lookahead records into a store (resumable)")
    _store_argument(collect)
    collect.add_argument("--families", default=None, help="comma-separated task families (default: the training families)")
    collect.add_argument("--tasks-per-family", type=int, default=40)
    collect.add_argument("--seed", type=int, default=0)
    collect.add_argument("--workers", type=int, default=1,
                         help="collector processes on this host (default 1); collectors on other hosts join "
                              "by running the same command against the same --store URL")
    collect.add_argument("--lease", type=float, default=None, metavar="SECONDS",
                         help="how long a task claimed by a collector that stopped answering stays held "
                              "(default 120)")
    collect.set_defaults(run=run_collect)
    train = commands.add_parser("train", help="KerasTuner search, split by task family; saves a .keras model")
    _store_argument(train)
    train.add_argument("--output", required=True, help="where to save the .keras meta-model (report beside it)")
    train.add_argument("--max-trials", type=int, default=8)
    train.add_argument("--epochs", type=int, default=40)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--ensemble", type=int, default=1,
                       help="fits of the best hyperparameters averaged into one model (default 1)")
    train.set_defaults(run=run_train)
    evaluate = commands.add_parser(
        "eval", help="judge a meta-model on held-out tasks against a grid, ReduceLROnPlateau and cosine "
                     "(or, with --store, its picks on recorded decision points)")
    evaluate.add_argument("meta_model", nargs="?", default="default", metavar="MODEL",
                          help="\"default\" (the shipped model) or a .keras path")
    evaluate.add_argument("--families", default=None,
                          help="comma-separated held-out families (default: kadapt.cli.meta_evaluation's six)")
    evaluate.add_argument("--seeds", default=None, help="comma-separated seeds (default: 0,1,2)")
    evaluate.add_argument("--epochs", type=int, default=None, help="epochs per run (default 20)")
    evaluate.add_argument("--quick", action="store_true", help="two families, one seed, 6 epochs: a smoke run")
    evaluate.add_argument("--store", default=None,
                          help="instead: accuracy and regret per task family on this record store's decisions")
    evaluate.add_argument("--meta-model", dest="meta_model_option", default=None, help=argparse.SUPPRESS)
    evaluate.set_defaults(run=run_eval)


def _store_argument(parser):
    parser.add_argument("--store", required=True,
                        help="a record store: an SQLite file path (created if missing) or a "
                             "postgresql://user@host:port/database URL (schema created on first use)")


def _open_store(location):
    from kadapt.meta import RecordStore

    try:
        return RecordStore(location)
    except ValueError as error:
        raise UsageError(str(error)) from None


def run_collect(args) -> int:
    from kadapt.meta import collect
    from kadapt.meta.records import tasks

    families = tasks.TRAINING_FAMILIES if args.families is None else tuple(args.families.split(","))
    if args.tasks_per_family <= 0:
        raise UsageError(f"--tasks-per-family must be a positive int. Received: {args.tasks_per_family}")
    try:
        task_list = [tasks.make_task(f, seed) for seed in range(args.tasks_per_family) for f in families]
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.workers < 1:
        raise UsageError(f"--workers must be a positive int. Received: {args.workers}")
    if args.lease is not None and not (0 < args.lease < float("inf")):
        raise UsageError(f"--lease must be a positive number of seconds. Received: {args.lease}")
    store = _open_store(args.store)
    lease = {} if args.lease is None else {"lease_seconds": args.lease}
    appended = collect(store, task_list, seed=args.seed, workers=args.workers, **lease)
    print(f"{appended} records appended; {store.count()} in {store.location}")
    return 0


def run_train(args) -> int:
    from pathlib import Path

    from kadapt.meta import train_meta_model
    from kadapt.tuning import distributed_search

    try:
        search = distributed_search()  # before the store opens: a bad setting creates no file
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.ensemble < 1:
        raise UsageError(f"argument --ensemble must be a count of fits >= 1, e.g. 5. Received: {args.ensemble}")
    store = _open_store(args.store)
    if search is not None:
        role = "serves the search at" if search.is_chief else "runs trials for the chief at"
        print(f"{search.tuner_id} {role} {search.oracle_ip}:{search.oracle_port}", flush=True)
    try:
        _, report = train_meta_model(store, Path(args.output).parent / "tuner", args.output,
                                     max_trials=args.max_trials, epochs=args.epochs, seed=args.seed,
                                     ensemble=args.ensemble)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if report is None:
        print(f"worker {search.tuner_id}: its trials are done; the chief saves {args.output}")
        return 0
    print(json.dumps(report["mean"], indent=1))
    print(f"saved {args.output} (report: {Path(args.output).with_suffix('.json')})")
    return 0


def run_eval(args) -> int:
    from kadapt.meta.model.meta_model import load_meta_model

    try:
        model = load_meta_model(args.meta_model_option or args.meta_model)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.store is not None:
        return _eval_on_records(model, args.store)
    from kadapt.cli import meta_evaluation as evaluation

    options = dict(evaluation.QUICK) if args.quick else {}
    if args.families is not None:
        options["families"] = tuple(args.families.split(","))
    if args.seeds is not None:
        options["seeds"] = tuple(_int(seed, "--seeds") for seed in args.seeds.split(","))
    if args.epochs is not None:
        if args.epochs < 1:
            raise UsageError(f"--epochs must be a positive int. Received: {args.epochs}")
        options["epochs"] = args.epochs
    unknown = sorted(set(options.get("families", ())) - set(_known_families()))
    if unknown:
        raise UsageError(f"--families: unknown {unknown}; known: {', '.join(_known_families())}")
    runs = evaluation.evaluate_meta_model(model, progress=lambda text: print(text, flush=True), **options)
    print(evaluation.table(runs))
    return 0


def _known_families():
    from kadapt.meta.records import tasks

    return sorted(tasks.TRAINING_FAMILIES + tasks.HELD_OUT_FAMILIES)


def _int(text, flag):
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated ints. Received: {text!r}") from None


def _eval_on_records(model, store):
    from kadapt.meta.model.meta_model import decision_data
    from kadapt.meta.model.meta_model import evaluate_policies

    try:
        data = decision_data(list(_open_store(store)))
    except ValueError as error:
        raise UsageError(str(error)) from None
    print(f"{'family':<16}{'decisions':>10}  " + "  ".join(f"{p + ' acc/regret':>22}" for p in ("meta_model", "keep", "rule")))
    for family in sorted(set(data.families.tolist())):
        subset = data.subset(data.families == family)
        report = evaluate_policies(subset, model)
        cells = "  ".join(f"{report[p]['accuracy']:>12.2f} / {report[p]['regret']:<7.3f}" for p in ("meta_model", "keep", "rule"))
        print(f"{family:<16}{len(subset):>10}  {cells}")
    return 0
