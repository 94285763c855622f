"""The layers reachable from a layer or model, nested ones included."""

from __future__ import annotations

import keras


def reachable_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Returns every layer reachable from `layer` (itself included), once each."""
    found, seen, stack = [], set(), [layer]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        stack.extend(_children(current))
    return found


def _children(layer):
    if isinstance(layer, keras.Model):
        return list(layer.layers)
    children = []
    for value in vars(layer).values():
        if isinstance(value, keras.layers.Layer):
            children.append(value)
        elif isinstance(value, (list, tuple)):
            children.extend(v for v in value if isinstance(v, keras.layers.Layer))
    return children
