"""The `MetaAdjuster`'s state on disk: one `.npz` of arrays plus a JSON tree, no pickle.

A state is a tree of dicts and lists whose leaves are JSON values or NumPy
arrays. Each array is stored under its own name in the `.npz` and its place
in the tree is a `{"__array__": name}` marker in the JSON, which rides in the
same file as a string array. The file is written aside and renamed, so it is
whole or absent; it is read with `allow_pickle=False`.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "kadapt.MetaAdjuster"
VERSION = 1
_TREE = "__tree__"


def save_state(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Writes `state` to `path` (an `.npz`), replacing it whole.

    Example:

    ```python
    save_state("backup/meta-adjuster-epoch-3.npz", adjuster.get_state())
    ```
    """
    path = Path(path)
    arrays = {}
    tree = _split({"format": FORMAT, "version": VERSION, **state}, arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(path.name + ".partial.npz")
    np.savez(aside, **{_TREE: np.array(json.dumps(tree))}, **arrays)
    os.replace(aside, path)


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a state `save_state` wrote; a corrupt or foreign file is a `ValueError` naming it."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {name: saved[name] for name in saved.files}
        tree = json.loads(str(arrays.pop(_TREE)))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(_unreadable(path, f"it cannot be read ({type(error).__name__}: {error})")) from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT or tree.get("version") != VERSION:
        raise ValueError(_unreadable(path, f"it is not a {FORMAT} state of version {VERSION}"))
    return _join(tree, arrays, path)


def _unreadable(path, why):
    return (f"The MetaAdjuster state {path} is unusable: {why}. Resume from the backup of the run that "
            "wrote it, or start the run afresh (--overwrite).")


def _split(node, arrays):
    if isinstance(node, np.ndarray):
        name = f"array_{len(arrays)}"
        arrays[name] = node
        return {"__array__": name}
    if isinstance(node, dict):
        return {key: _split(value, arrays) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_split(value, arrays) for value in node]
    return node


def _join(node, arrays, path):
    if isinstance(node, dict) and set(node) == {"__array__"}:
        if node["__array__"] not in arrays:
            raise ValueError(_unreadable(path, f"it lacks the array {node['__array__']!r}"))
        return arrays[node["__array__"]]
    if isinstance(node, dict):
        return {key: _join(value, arrays, path) for key, value in node.items()}
    if isinstance(node, list):
        return [_join(value, arrays, path) for value in node]
    return node
