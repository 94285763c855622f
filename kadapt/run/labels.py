"""The task a run's labels call for, as a data scientist reads them.

- Strings are class names (sorted; their index is the class the network outputs).
- Numbers with a fractional part are a target to regress.
- Whole numbers that classify but are not 0, 1, 2, ... (-1 and 1; codes such
  as 101, 205, 310 under `--task classification`) are class names, written
  as the numbers (`Labels.numbers`): predictions come out as those numbers.
- Whole numbers (integers, or floats that are all whole, as a column with
  empty cells is stored) that leave most of 0 .. their largest unused (more
  than `CLASS_CODES` numbers per value: a year, counts of hundreds) are
  values to regress, not class numbers. Others are classes while they take few values: at most
  `CLASS_LIMIT` distinct values; more only while they number at most
  `CLASS_SHARE` of the training rows (AutoGluon's rule for large tables) and
  the rarest is at least `CLASS_BALANCE` as frequent as the commonest, as the
  classes of a many-class set are. A price, or a count with a long tail
  (statsmodels' randhie doctor visits: 78 values, most rows 0-5), is a
  regression; so is scikit-learn's diabetes target (214 values in 442 rows).

`--task classification|regression` overrides the reading; the reason for it
is printed and recorded.
"""

import dataclasses

import numpy as np

from kadapt.recipes.task import CLASSIFICATION
from kadapt.recipes.task import REGRESSION
from kadapt.recipes.task import Task
from kadapt.run.errors import UsageError


CLASS_LIMIT = 20
CLASS_SHARE = 0.05
CLASS_BALANCE = 0.1
# Class numbers are 0, 1, 2, ... (the network has one output per number up to the largest): whole numbers
# that leave most of those unused (1854's wounds: 12 values up to 480; a year) are quantities.
CLASS_CODES = 2


@dataclasses.dataclass(frozen=True)
class Labels:
    """The `Task` of a run's labels, the reason it was read so and, for
    string labels, the sorted class names."""

    task: Task
    class_names: tuple | None = None
    reason: str = ""
    numbers: bool = False  # the class names are whole numbers, in their order (`number_names`)

    def coded(self, y):
        """Labels as the network learns them: int32 classes, or float32 targets."""
        if self.task.is_regression:
            return np.asarray(y, "float32")
        if self.numbers:
            return np.searchsorted(np.array(self.class_names, "float64"), np.asarray(y, "float64")).astype("int32")
        if self.class_names is not None:
            return np.searchsorted(np.array(self.class_names), y).astype("int32")
        return np.asarray(y).astype("int32")


def label_task(spec, y_train, others=(), task=None, names=None):
    """The `Labels` of training labels `y_train` (N,); `others` (validation,
    test labels) must be of the same kind and join the class names. `task`
    (`"classification"`, `"regression"` or `None`) overrides the reading.
    With `names` (sorted class names: a streamed table's), the labels are
    already their indices in `names`.

    Regression standardizes with `y_train` alone. One class only, fewer
    training rows than classes, negative classes and non-finite targets are
    `UsageError`s."""
    kind = "U" if names is not None else np.asarray(y_train).dtype.kind
    if kind == "U" and task == REGRESSION:
        raise UsageError(f"--task regression: the labels of {spec} are words, not numbers. Drop --task, or "
                         "pass a column of numbers as the target.")
    chosen, reason = (task, "--task") if task else _reading(y_train, kind)
    if chosen == REGRESSION:
        return Labels(_regression(spec, y_train), reason=reason)
    if kind == "U":
        given = names is not None
        names = tuple(str(name) for name in (names if given else np.unique(np.concatenate([y_train, *others]))))
        labels = Labels(Task(CLASSIFICATION, len(names)), names, reason)
        coded = np.asarray(y_train) if given else labels.coded(y_train)
    else:
        every = np.concatenate([np.asarray(y_train).reshape(-1), *(np.asarray(y).reshape(-1) for y in others)])
        _check_class_numbers(spec, every, task)
        values = np.unique(every)
        if values.size and (values[0] < 0 or values[-1] + 1 > CLASS_CODES * len(values)):  # codes, not 0, 1, 2, ...
            names = tuple(number_names(values).tolist())
            labels = Labels(Task(CLASSIFICATION, len(names)), names, f"{reason}; numbered otherwise than 0, 1, 2, ...: "
                            "each number names a class", numbers=True)
        else:
            labels = Labels(Task(CLASSIFICATION, int(every.max()) + 1 if every.size else 0), reason=reason)
        coded = labels.coded(y_train)
    _check_classes(spec, coded, labels)
    return labels


def _reading(y_train, kind):
    """`(task, reason)` of labels with no `--task`."""
    y = np.asarray(y_train)
    if kind == "U":
        return CLASSIFICATION, "the labels are words: class names"
    if y.dtype.kind == "f" and not np.all(y == np.round(y)):
        return REGRESSION, "the labels are numbers with a fractional part: values to predict"
    values, counts = np.unique(y, return_counts=True)
    distinct, rows = len(counts), len(y)
    if distinct > CLASS_LIMIT and distinct > CLASS_SHARE * rows:
        return REGRESSION, (f"{distinct} distinct whole numbers in {rows} training rows: more than {CLASS_LIMIT} and "
                            f"more than {CLASS_SHARE:.0%} of the rows, so values to predict, not classes")
    if distinct > CLASS_LIMIT and counts.min() < CLASS_BALANCE * counts.max():
        return REGRESSION, (f"{distinct} distinct whole numbers in {rows} training rows, the rarest {counts.min()} "
                            f"times against the commonest's {counts.max()}: a count with a long tail, values to "
                            "predict, not classes")
    if values.max() + 1 > CLASS_CODES * distinct:
        return REGRESSION, (f"{distinct} distinct whole numbers in {rows} training rows, from {values.min():g} to "
                            f"{values.max():g}: classes are numbered 0, 1, 2, ... and these leave most numbers up to "
                            "their largest unused, so values to predict, not classes")
    if distinct <= CLASS_LIMIT:
        return CLASSIFICATION, f"{distinct} distinct whole numbers in {rows} training rows: classes (at most {CLASS_LIMIT})"
    return CLASSIFICATION, (f"{distinct} distinct whole numbers in {rows} training rows, at most {CLASS_SHARE:.0%} "
                            "of the rows and about as frequent as each other: classes")


def _check_class_numbers(spec, every, task):
    if every.dtype.kind == "f" and not np.all(every == np.round(every)):
        raise UsageError(f"--task classification: the labels of {spec} hold {every[every != np.round(every)][0]}; "
                         "classes are whole numbers or words. Drop --task for a regression.")


def number_names(values) -> np.ndarray:
    """Whole numbers as the class names they are (`101`, `-1`; `""` where missing); strings as they are."""
    values = np.asarray(values)
    if values.dtype.kind in "OUS":
        return values.astype(str)
    given = ~np.isnan(values) if values.dtype.kind == "f" else np.ones(values.shape, bool)
    names = np.full(values.shape, "", dtype=object)
    names[given] = values[given].astype("int64").astype(str)
    return names.astype(str)


def _regression(spec, y_train):
    y = np.asarray(y_train, "float64")
    if not np.all(np.isfinite(y)):
        row = int(np.flatnonzero(~np.isfinite(y))[0])
        raise UsageError(f"--data {spec}: training label {row} (counted from 0) is {y[row]}; a regression "
                         "target must be a finite number. Fix or drop the row.")
    if y.min() == y.max():
        raise UsageError(f"--data {spec}: the float labels (a regression target) hold {y[0]:g} in every training "
                         "row: there is nothing to learn. Check the labels file.")
    return Task.regression(y)


def _check_classes(spec, coded, labels):
    present = np.unique(coded)
    if len(present) < 2:
        name = labels.class_names[present[0]] if labels.class_names else present[0]
        raise UsageError(f"--data {spec}: every training label is {name}: one class only, nothing to tell "
                         "apart. Give rows of at least two classes.")
    if len(coded) < labels.task.outputs:
        regression = "" if labels.class_names and not labels.numbers else \
            " Whole numbers are classes: for a regression, pass --task regression."
        raise UsageError(f"--data {spec}: {len(coded)} training rows for {labels.task.outputs} classes; each class "
                         f"needs rows to learn from. Give more rows, or fewer classes.{regression}")
