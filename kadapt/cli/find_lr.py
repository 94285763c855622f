"""`kadapt find-lr`: the learning-rate range test (`kadapt.find_learning_rate`)
on the network and data of `kadapt train`, compiled with the recipe's optimizer;
prints the suggested rate for `--learning-rate`."""

from kadapt.cli.train import add_data_arguments
from kadapt.cli.train import add_recipe_arguments
from kadapt.range_test.curve import RULES


def add_find_lr_arguments(subparsers) -> None:
    parser = subparsers.add_parser(
        "find-lr", description=__doc__,
        help="a learning-rate range test: print the rate to pass as --learning-rate",
    )
    add_data_arguments(parser)
    add_recipe_arguments(parser.add_argument_group("the recipe (kadapt.recipes.FastFitConfig)"))
    sweep = parser.add_argument_group("the range test (kadapt.find_learning_rate)")
    sweep.add_argument("--start", type=float, default=1e-7, help="the first rate (default: 1e-7)")
    sweep.add_argument("--stop", type=float, default=10.0, help="the last rate (default: 10)")
    sweep.add_argument("--num-steps", type=int, default=100, help="steps, one batch and rate each (default: 100)")
    sweep.add_argument("--rule", choices=tuple(RULES), default="valley",
                       help="valley (fastai's default), steepest (Lightning's), minimum/10 (default: valley)")
    parser.add_argument("--out", default=None,
                        help="a directory to write range_test.json (the curve) and range_test.png into "
                             "(default: none, print only)")
    parser.set_defaults(run=run_find_lr)


def run_find_lr(args) -> int:
    from kadapt.run.find_lr import OPTIONS
    from kadapt.run.find_lr import find_rate

    options = {name: getattr(args, name) for name in OPTIONS}
    sweep = {"start": args.start, "stop": args.stop, "num_steps": args.num_steps, "rule": args.rule}
    find_rate(options, sweep, out=args.out, echo=lambda line: print(line, flush=True))
    return 0
