"""The `kadapt` command line: one module per command, each adding its parser
with `add_<command>_arguments(subparsers)` and its `run` function.

The parser is built from modules that import no TensorFlow, so `--help`,
`--version` and `kadapt report` answer at once. After parsing, TensorFlow is
configured (`kadapt.environment`) and loaded for the commands that train or
run a model, with its C++ start-up lines held back unless `--verbose`
(anywhere on the line) or the user's `TF_CPP_MIN_LOG_LEVEL` asks for them;
those commands import their heavy modules inside their `run` function.

A mistake in the user's input (`kadapt.run.UsageError`, a bad flag) ends the
command with one line, `kadapt: error: ...`, and a non-zero exit status. A
reader that closes the pipe early (`kadapt report RUN | head -2`) ends it
quietly.
"""

import argparse
import os
import sys

from kadapt import __version__
from kadapt import environment
from kadapt.extras import MissingExtraError
from kadapt.extras import UnsupportedBackendError
from kadapt.run.errors import UsageError

VERBOSE = "--verbose"
BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left


class ArgumentParser(argparse.ArgumentParser):
    """Reports a bad command line in one line, like every other user error."""

    def error(self, message):
        raise SystemExit(f"kadapt: error: {message} (see: {self.prog} --help)")


def build_parser() -> ArgumentParser:
    """The `kadapt` parser with every command; imports no TensorFlow."""
    from kadapt.cli.export import add_export_arguments
    from kadapt.cli.find_lr import add_find_lr_arguments
    from kadapt.cli.meta import add_meta_arguments
    from kadapt.cli.predict import add_predict_arguments
    from kadapt.cli.probe import add_probe_arguments
    from kadapt.cli.report import add_report_arguments
    from kadapt.cli.train import add_train_arguments

    parser = ArgumentParser(prog="kadapt", description="Keras training that adapts to the machine and to the run.")
    parser.add_argument("--version", action="version", version=f"kadapt {__version__}")
    parser.add_argument(VERBOSE, action="store_true",
                        help="show TensorFlow's C++ log lines (also accepted after the command)")
    commands = parser.add_subparsers(dest="command", required=True)
    add_train_arguments(commands)
    add_report_arguments(commands)
    add_predict_arguments(commands)
    add_export_arguments(commands)
    add_probe_arguments(commands)
    add_find_lr_arguments(commands)
    add_meta_arguments(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one `kadapt` command line (`sys.argv[1:]` by default); returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = VERBOSE in argv
    argv = [arg for arg in argv if arg != VERBOSE]
    args = build_parser().parse_args(argv)
    args.verbose, args.argv = verbose, argv
    try:
        if _loads_tensorflow(args):
            tf = environment.load_tensorflow(verbose=verbose)
            _steady_peaks(tf, args)
        status = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return status
    except (UsageError, environment.AllocatorStatisticsError, MissingExtraError, UnsupportedBackendError) as error:
        raise SystemExit(f"kadapt: error: {error}") from None
    except KeyboardInterrupt:
        print(f"kadapt: interrupted ({args.command})", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE_STATUS


def _steady_peaks(tf, args):
    """A command that measures or trains under `--memory-budget` in one process runs with one
    inter-op thread (`kadapt.environment.steady_peaks`) and says so (on standard error beside
    `--json`); a worker's threads are its share, and a budget that does not parse is the
    command's own one-line error, before any output."""
    from kadapt.batching.memory_budget import parse_memory_size

    budget = getattr(args, "memory_budget", None)
    if budget is None or os.environ.get("TF_CONFIG"):
        return
    try:
        parse_memory_size(budget, "memory_budget")
    except (TypeError, ValueError):
        return
    line = environment.steady_peaks(tf)
    if line is not None:
        print(f"threads: {line}", file=sys.stderr if getattr(args, "json", False) else sys.stdout)


def _loads_tensorflow(args):
    """Whether the command loads TensorFlow first. `kadapt report` reads JSON; the
    `kadapt train --workers N` launcher only starts the workers, each of which loads its own."""
    launcher = args.command == "train" and args.workers != 1
    return getattr(args, "tensorflow", True) and not launcher


def _silence_stdout():
    """Points stdout at /dev/null, so that the interpreter's last flush of
    what the closed pipe did not take raises nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
