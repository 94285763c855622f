"""A throwaway PostgreSQL cluster for the tests: `initdb` + `pg_ctl` in a temporary
directory, on a free port of 127.0.0.1, run as the `postgres` user when the tests run
as root (PostgreSQL refuses root), stopped when the context ends, also on failure."""

import contextlib
import getpass
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

START_TIMEOUT_SECONDS = 60


def bin_directory():
    """The directory of `initdb` and `pg_ctl`: `pg_config --bindir`, else Debian's layout."""
    if shutil.which("pg_config"):
        found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
        if (Path(found) / "initdb").is_file():
            return Path(found)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not candidates:
        raise RuntimeError("PostgreSQL is not installed: `apt-get install postgresql` (make test does it).")
    return Path(candidates[-1]).parent


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def cluster():
    """Yields `(host, port, user)` of a running throwaway server; trust authentication on 127.0.0.1."""
    binaries = bin_directory()
    as_root = os.geteuid() == 0
    user = "postgres" if as_root else getpass.getuser()
    with tempfile.TemporaryDirectory(prefix="kadapt-pg-") as folder:
        data = Path(folder) / "data"
        if as_root:
            shutil.chown(folder, user="postgres")
        run = _runner(as_root)
        run([binaries / "initdb", "-D", data, "-U", user, "--auth=trust", "--no-sync", "-E", "UTF8"])
        port = free_port()
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {folder} -c fsync=off"
        run([binaries / "pg_ctl", "-D", data, "-o", options, "-l", Path(folder) / "log", "-w",
             "-t", str(START_TIMEOUT_SECONDS), "start"])
        try:
            yield "127.0.0.1", port, user
        finally:
            run([binaries / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"], check=False)


def _runner(as_root):
    def run(command, check=True):
        command = [str(part) for part in command]
        if as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120)

    return run


def create_database(host, port, user, name):
    """A new empty database on the server; returns its URL."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(host=host, port=port, user=user, dbname="postgres", autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return f"postgresql://{user}@{host}:{port}/{name}"
