"""`kadapt.meta.host_reads`: host copies equal to the variables, and unmoved by later updates."""

import keras
import numpy as np
import pytest

from kadapt.meta import host_reads

pytestmark = pytest.mark.backends("tensorflow", "jax")


@pytest.mark.parametrize("count", [3, host_reads._BATCHED_FROM + 4], ids=["one_by_one", "in_one_call"])
def test_copies_equal_the_variables_and_stay_put_when_they_change(count):
    rng = np.random.default_rng(0)
    expected = [rng.normal(size=(i + 1, 3)).astype("float32") for i in range(count)]
    variables = [keras.Variable(value) for value in expected]
    copies = host_reads.read_to_host(variables)
    for variable in variables:
        variable.assign(variable + 1.0)
    for copy, value in zip(copies, expected, strict=True):
        np.testing.assert_array_equal(copy, value)
    again = host_reads.read_to_host(variables)  # the cached reader sees the new values
    for copy, value in zip(again, expected, strict=True):
        np.testing.assert_array_equal(copy, value + 1.0)


def test_no_variables():
    assert host_reads.read_to_host([]) == []
