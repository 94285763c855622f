"""Ctrl-C cannot cut a `kadapt train` checkpoint short."""

import os
import signal
import time

import pytest

from kadapt.run.backup import _sigint_held


def test_sigint_waits_until_the_checkpoint_is_written():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    written = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with _sigint_held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                written.append(True)  # not interrupted half-way
    finally:
        signal.signal(signal.SIGINT, previous)
    assert written == [True]
