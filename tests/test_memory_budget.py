"""Device budgets and sizes such as "2GiB"."""

import pytest

from kadapt.batching import memory_budget
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.memory_budget import parse_memory_size


@pytest.mark.parametrize(
    "text, expected",
    [("2GiB", 2 * 2**30), ("512 MB", 512 * 10**6), ("1.5k", 1536), ("4096", 4096), (1e6, 10**6)],
)
def test_parse_memory_size(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "2 parsecs", "", "1e3GB"])
def test_unparsable_sizes(text):
    with pytest.raises(ValueError, match=rf"`memory_budget` could not be parsed.*'2GiB'.*Received: memory_budget={text!r}"):
        parse_memory_size(text)


@pytest.mark.parametrize("value", [0, -5, "0GiB"])
def test_non_positive_sizes(value):
    with pytest.raises(ValueError, match=r"`memory_budget` must be a positive size.*Received: memory_budget="):
        parse_memory_size(value)


def test_size_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"`memory_budget` must be a number of bytes.*Received: memory_budget=\[1\]"):
        parse_memory_size([1])


def test_argument_then_environment_then_ram(monkeypatch):
    monkeypatch.setenv("KADAPT_MEMORY_BUDGET", "3MiB")
    assert device_budget("1MiB", "CPU:0").bytes == 2**20
    from_environment = device_budget(None, "CPU:0")
    assert (from_environment.bytes, from_environment.source) == (3 * 2**20, "KADAPT_MEMORY_BUDGET")
    monkeypatch.delenv("KADAPT_MEMORY_BUDGET")
    monkeypatch.setattr(memory_budget, "available_ram", lambda: 10 * 2**30)
    from_ram = device_budget(None, "CPU:0")
    assert from_ram.bytes == 5 * 2**30 and "available RAM" in from_ram.source


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("KADAPT_MEMORY_BUDGET", "plenty")
    with pytest.raises(ValueError, match="`KADAPT_MEMORY_BUDGET` could not be parsed"):
        device_budget(None, "CPU:0")
