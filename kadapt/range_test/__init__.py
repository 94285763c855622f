"""The learning-rate range test: `find_learning_rate` and its `RangeTestResult`."""

from kadapt.range_test.find import find_learning_rate
from kadapt.range_test.result import RangeTestResult
