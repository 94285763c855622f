"""`kadapt` processes, forked, for tests/test_run_processes.py (run as a script).

    python forked_train.py

Imports the `kadapt` command and TensorFlow once (about 5 s), then forks a
process for each `start` request, which runs `kadapt ARGV...` as the command
does (`kadapt.cli.main`): a real process of its own, which a test can stop,
continue and kill -9, that costs its run and not TensorFlow's import. (No
TensorFlow op runs here before a fork: each child starts TensorFlow's runtime.)

Requests on stdin, one JSON object a line, each answered by one on stdout:

    {"start": ARGV, "cwd": DIR, "log": FILE}  ->  {"pid": PID}
        its stdout and stderr go to FILE
    {"wait": PID, "kill_after": SECONDS or null, "timeout": SECONDS}  ->  {"code": CODE, "seconds": S}
        its exit status (-9: killed), killed with SIGKILL `kill_after` seconds after it
        started, or `timeout` seconds after the request (then "timed_out": true)

At the end of stdin, what still runs is killed.
"""

import importlib
import json
import os
import signal
import sys
import time

from kadapt import environment

environment.load_tensorflow(verbose=False)

from kadapt import cli  # noqa: E402

importlib.import_module("kadapt.run.pipeline")  # the training job's modules, imported before the forks

POLL_SECONDS = 0.005


def start(argv, cwd, log):
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: `kadapt ARGV` in `cwd`, as `python -m kadapt` runs it
        output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.chdir(cwd)
        code = cli.main(argv)
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else 1
        if isinstance(end.code, str):
            print(end.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wait(pid, started, kill_after, timeout):
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"code": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - started}
        now = time.monotonic()
        if (kill_after is not None and now >= started + kill_after) or now >= deadline:
            os.kill(pid, signal.SIGKILL)  # not reaped yet: the id is still this child's
            os.waitpid(pid, 0)
            return {"code": -signal.SIGKILL, "seconds": now - started, "timed_out": now >= deadline}
        time.sleep(POLL_SECONDS)


def main():
    running = {}
    try:
        for line in sys.stdin:
            request = json.loads(line)
            if "start" in request:
                pid = start(request["start"], request["cwd"], request["log"])
                running[pid] = time.monotonic()
                answer = {"pid": pid}
            else:
                pid = request["wait"]
                answer = wait(pid, running.pop(pid), request["kill_after"], request["timeout"])
            print(json.dumps(answer), flush=True)
    finally:
        for pid in running:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
