"""The `kadapt` command line: one module per command, each adding its parser
with `add_<command>_arguments(subparsers)` and its `run` function.

TensorFlow is configured (`kadapt.environment`) and loaded before any command
module is imported, with its C++ start-up lines held back unless `--verbose`
(anywhere on the line) or the user's `TF_CPP_MIN_LOG_LEVEL` asks for them.

A mistake in the user's input (`kadapt.run.UsageError`, a bad flag) ends the
command with one line, `kadapt: error: ...`, and a non-zero exit status.
"""

import argparse
import sys

from kadapt import environment
from kadapt.extras import MissingExtraError

VERBOSE = "--verbose"


class ArgumentParser(argparse.ArgumentParser):
    """Reports a bad command line in one line, like every other user error."""

    def error(self, message):
        raise SystemExit(f"kadapt: error: {message} (see: {self.prog} --help)")


def build_parser():
    from kadapt.cli.meta import add_meta_arguments
    from kadapt.cli.predict import add_predict_arguments
    from kadapt.cli.probe import add_probe_arguments
    from kadapt.cli.report import add_report_arguments
    from kadapt.cli.train import add_train_arguments

    parser = ArgumentParser(prog="kadapt", description="Keras training that adapts to the machine and to the run.")
    parser.add_argument(VERBOSE, action="store_true",
                        help="show TensorFlow's C++ log lines (also accepted after the command)")
    commands = parser.add_subparsers(dest="command", required=True)
    add_train_arguments(commands)
    add_report_arguments(commands)
    add_predict_arguments(commands)
    add_probe_arguments(commands)
    add_meta_arguments(commands)
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = VERBOSE in argv
    environment.load_tensorflow(verbose=verbose)
    from kadapt.run.errors import UsageError

    argv = [arg for arg in argv if arg != VERBOSE]
    args = build_parser().parse_args(argv)
    args.verbose, args.argv = verbose, argv
    try:
        return args.run(args)
    except (UsageError, environment.AllocatorStatisticsError, MissingExtraError) as error:
        raise SystemExit(f"kadapt: error: {error}") from None
    except KeyboardInterrupt:
        print(f"kadapt: interrupted ({args.command})", file=sys.stderr)
        return 130
