"""`kadapt report RUN_DIR`: re-draw a run's plots and print its summary table."""

from kadapt.run import RunDirectory
from kadapt.run import draw_plots
from kadapt.run.report import epoch_table
from kadapt.run.report import format_table
from kadapt.run.report import summary


def add_report_arguments(subparsers):
    parser = subparsers.add_parser("report", description=__doc__, help="re-draw a run's plots, print a summary")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `kadapt train`")
    parser.set_defaults(run=run_report)


def run_report(args):
    directory = RunDirectory(args.run_dir)
    rows = summary(directory)
    plots = draw_plots(directory)
    print(format_table(rows + [("plots", ", ".join(str(p) for p in plots) or "none yet")]))
    epochs = epoch_table(directory)
    if epochs:
        print("\n" + epochs)
    return 0
