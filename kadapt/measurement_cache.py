"""Measurements kept on disk between runs, so that a machine pays each one once.

A measurement (the probe's micro-batch, the numerics' step times) is stored
under a key: a digest of everything it depends on (the model, its inputs,
the device, the library versions). A later run with the same key reads it
instead of measuring again. One JSON file per kind of measurement in
`$KADAPT_CACHE_DIR` (default `~/.cache/kadapt`), written atomically: a reader
never sees half a file, and an unreadable file counts as empty (a warning).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

logger = logging.getLogger("kadapt")


def cache_file(name: str) -> Path:
    """The file of the measurements called `name` (e.g. `"probe-cache.json"`)."""
    folder = os.environ.get("KADAPT_CACHE_DIR") or Path("~/.cache/kadapt").expanduser()
    return Path(folder) / name


def read_cache(name: str) -> dict:
    """`{key: entry}` of the cache file `name`; empty where there is none or it cannot be read."""
    path = cache_file(name)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        logger.warning("ignoring unreadable cache %s (%s)", path, error)
        return {}


def write_cache(name: str, key: str, entry: Any) -> None:
    """Stores `entry` (JSON) under `key` in the cache file `name`."""
    path = cache_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = read_cache(name)
    entries[key] = entry
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(entries, indent=1))
    os.replace(temporary, path)  # atomic: readers never see half a file


def digest(signature: Any) -> str:
    """The key of a JSON-able `signature`, with the numbers Keras appends to
    auto-generated names ("conv2d_3") left out: the same architecture built
    in another session hits the same entry."""
    text = re.sub(r"_\d+\b", "", json.dumps(signature, sort_keys=True, default=str))
    return hashlib.sha256(text.encode()).hexdigest()
