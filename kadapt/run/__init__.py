"""The `kadapt train` job and its run directory: config, data, callbacks, plots, report.

The config, the run directory and the report import no TensorFlow (`kadapt
report` and the command line's parser use them); the training job's names
load their modules when first used (PEP 562).
"""

from kadapt.lazy import lazy_attributes

from kadapt.run.config import RunConfig
from kadapt.run.config import resolve_config
from kadapt.run.errors import UsageError
from kadapt.run.plots import draw_plots
from kadapt.run.run_directory import RunDirectory

_NAMES = {"start_run": "kadapt.run.pipeline", "train": "kadapt.run.pipeline"}
__all__ = ["RunConfig", "RunDirectory", "UsageError", "draw_plots", "resolve_config", *sorted(_NAMES)]


__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
