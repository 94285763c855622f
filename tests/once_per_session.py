"""`once_per_session`: a costly result made by one pytest-xdist worker and read by the others."""

import json
import os
import time

import pytest


def once_per_session(tmp_path_factory, name, produce, timeout_seconds):
    """`produce()`'s JSON-able result, made once per test session: the first worker
    to ask makes it, the others wait for it (a failure reaches them too)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    results, failed = root / f"{name}.json", root / f"{name}.failed"
    try:
        os.close(os.open(root / f"{name}.lock", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return _wait_for(name, results, failed, timeout_seconds)
    try:
        result = produce()
    except BaseException as error:
        failed.write_text(f"{type(error).__name__}: {error}")
        raise
    partial = root / f"{name}.partial.json"
    partial.write_text(json.dumps(result))
    partial.replace(results)
    return result


def _wait_for(name, results, failed, timeout_seconds):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if results.exists():
            return json.loads(results.read_text())
        if failed.exists():
            pytest.fail(f"{name} failed in another worker:\n{failed.read_text()}")
        time.sleep(0.5)
    pytest.fail(f"{name} gave no result within {timeout_seconds} s")
