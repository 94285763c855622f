"""`kadapt report RUN_DIR`: print a run's summary table; it writes nothing
unless `--redraw` asks it to draw the plots again."""

from kadapt.run import run_directory as files
from kadapt.run.plots import draw_plots
from kadapt.run.report import epoch_table
from kadapt.run.report import format_table
from kadapt.run.report import in_progress_text
from kadapt.run.report import summary
from kadapt.run.run_directory import RunDirectory


def add_report_arguments(subparsers) -> None:
    parser = subparsers.add_parser("report", description=__doc__, help="print a run's summary")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `kadapt train`")
    parser.add_argument("--redraw", action="store_true",
                        help="draw training.png and probe.png again from the run's records")
    parser.set_defaults(run=run_report, tensorflow=False)  # reads JSON; plots need matplotlib only


def run_report(args) -> int:
    directory = RunDirectory(args.run_dir)
    rows = summary(directory)
    notice = in_progress_text(directory)
    if notice:
        print(f"{notice}; what it has written so far:")
    plots = draw_plots(directory) if args.redraw else _existing_plots(directory)
    print(format_table(rows + [("plots", ", ".join(str(p) for p in plots) or "none yet")]))
    epochs = epoch_table(directory)
    if epochs:
        print("\n" + epochs)
    return 0


def _existing_plots(directory):
    return [path for path in (directory / files.TRAINING_PLOT, directory / files.PROBE_PLOT) if path.is_file()]
