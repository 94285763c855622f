"""The `kadapt train` job and its run directory: config, data, callbacks, plots, report."""

from kadapt.run.config import RunConfig
from kadapt.run.config import resolve_config
from kadapt.run.errors import UsageError
from kadapt.run.pipeline import start_run
from kadapt.run.pipeline import train
from kadapt.run.plots import draw_plots
from kadapt.run.run_directory import RunDirectory
