"""kadapt reads framework internals only through kadapt/_compat.py, and each name it reads exists here.

A framework-private name is one `_compat.PRIVATE_ATTRIBUTES` declares, or an underscored attribute
kadapt does not define itself (no function, class, parameter, assigned name or `self.name =` of that
name anywhere in kadapt/ but _compat.py). The other modules are read with `ast`; the overrides are
found by importing them, because a method that overrides a private one is, by its own `def`, a name
kadapt defines.
"""

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import keras
import pytest

from kadapt import _compat

pytestmark = pytest.mark.backends("tensorflow", "jax")

PACKAGE = Path(__file__).resolve().parents[1] / "kadapt"
PRIVATE_IMPORT = re.compile(r"\b(keras\.src|tensorflow\.python)\b")
COMPAT = PACKAGE / "_compat.py"
SOURCES = {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}
REFLECTION = ("getattr", "hasattr", "setattr", "delattr")
PYTHON_PUBLIC = {"os._exit"}  # underscored, and public: the Python library documents it
FRAMEWORKS = ("keras", "tensorflow", "jax", "keras_tuner")


def test_every_private_name_kadapt_reads_exists_in_this_installation():
    missing = _compat.missing_private_names()
    assert not missing, (
        f"Private names kadapt/_compat.py reads are gone in Keras {keras.__version__}: {', '.join(missing)}. "
        "Find where this release moved each (or a public API that replaces it), update kadapt/_compat.py, "
        "and state the tested versions in pyproject.toml.")


def test_a_moved_name_is_reported(monkeypatch):
    monkeypatch.setitem(_compat.PRIVATE_NAMES, "keras.src.trainers.compile_utils", ("get_loss", "moved_away"))
    monkeypatch.setitem(_compat.PRIVATE_NAMES, "keras.src.no_such_module", ("anything",))
    assert _compat.missing_private_names() == ["keras.src.trainers.compile_utils.moved_away",
                                               "keras.src.no_such_module.anything"]


def test_no_module_but_compat_names_framework_internals():
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "_compat.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE_IMPORT.search(line)]
    assert not found, f"framework internals outside kadapt/_compat.py (move them there): {found}"


def test_the_mask_reader_reads_what_a_layer_attached():
    embedded = keras.layers.Embedding(5, 2, mask_zero=True)(keras.ops.convert_to_tensor([[0, 3, 1]]))
    assert keras.ops.convert_to_numpy(_compat.get_keras_mask(embedded)).tolist() == [[False, True, True]]
    assert _compat.get_keras_mask(keras.ops.ones((1, 3))) is None


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _attributes(tree):
    """`(node, name)` for each attribute an expression names: `x.name`, `getattr(x, "name")`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFLECTION
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            yield node, node.args[1].value


def _defined(tree):
    """The names a module defines: functions, classes, parameters, assigned names, imports and the
    attributes it assigns to `self` or `cls`."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.alias):
            yield node.asname or node.name.rpartition(".")[2]
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            yield node.attr


KADAPT_NAMES = {name for path, tree in SOURCES.items() if path != COMPAT for name in _defined(tree)}


def _framework_private(name):
    return _private(name) and (name in _compat.PRIVATE_ATTRIBUTES or name not in KADAPT_NAMES)


def _declared_super_calls(path, tree):
    """The `super().name()` calls inside the overrides `_compat.PRIVATE_OVERRIDES` declares in this module."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return {inner for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            for inner in ast.walk(node) if isinstance(inner, ast.Attribute) and ast.unparse(inner.value) == "super()"
            and inner.attr in _compat.PRIVATE_OVERRIDES.get(f"{module}.{node.name}", ())}


def test_no_module_but_compat_touches_a_framework_private_attribute():
    found = []
    for path, tree in SOURCES.items():
        if path != COMPAT:
            allowed = _declared_super_calls(path, tree)
            found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)}"
                      for node, name in _attributes(tree) if _framework_private(name)
                      and node not in allowed and ast.unparse(node) not in PYTHON_PUBLIC]
    assert not found, ("private attributes of Keras/TensorFlow/JAX objects outside kadapt/_compat.py (read or set "
                       f"each through a function there, which says why and in which release): {found}")


def test_compat_declares_every_private_attribute_it_touches_or_overrides():
    own = set(_defined(SOURCES[COMPAT]))
    touched = {name for _, name in _attributes(SOURCES[COMPAT]) if _private(name) and name not in own}
    overridden = {name for names in _compat.PRIVATE_OVERRIDES.values() for name in names}
    undeclared = (touched | overridden) - set(_compat.PRIVATE_ATTRIBUTES)
    assert not undeclared, f"kadapt/_compat.py's PRIVATE_ATTRIBUTES does not declare {sorted(undeclared)}"


def test_the_walk_finds_a_private_attribute_read_set_or_named_in_a_string():
    tree = ast.parse("optimizer._learning_rate\nmodel._initial_epoch = 1\nhasattr(v, '_distributed_container')\n"
                     "self._multiplier.assign(1.0)\nv.__class__\nkeras.layers._made_up\n")
    assert sorted(name for _, name in _attributes(tree) if _framework_private(name)) == [
        "_distributed_container", "_initial_epoch", "_learning_rate", "_made_up"]


def _kadapt_classes():
    for module in pkgutil.walk_packages(importlib.import_module("kadapt").__path__, "kadapt."):
        if not module.name.endswith("__main__"):  # it runs the command line when imported
            yield from (value for value in vars(importlib.import_module(module.name)).values()
                        if inspect.isclass(value) and value.__module__.startswith("kadapt."))


def _where(owner, name):
    """`kadapt/...py:line Class.name`: where `owner` defines `name`."""
    member = vars(owner)[name]
    member = getattr(getattr(member, "fget", member), "__func__", getattr(member, "fget", member))
    try:
        line = inspect.getsourcelines(member)[1]
    except TypeError:  # not a function: the class's line
        line = inspect.getsourcelines(owner)[1]
    return f"{Path(inspect.getsourcefile(owner)).relative_to(PACKAGE.parent)}:{line} {owner.__qualname__}.{name}"


def test_no_class_overrides_a_framework_private_method_but_those_compat_declares():
    found = set()
    for cls in _kadapt_classes():
        for position, owner in enumerate(cls.__mro__):
            declared = _compat.PRIVATE_OVERRIDES.get(f"{owner.__module__}.{owner.__qualname__}", ())
            framework = [base for base in cls.__mro__[position + 1:] if base.__module__.partition(".")[0] in FRAMEWORKS]
            if owner.__module__.startswith("kadapt."):
                found |= {_where(owner, name) for name in vars(owner) if _private(name) and name not in declared
                          and any(name in vars(base) for base in framework)}
    assert not found, ("kadapt classes override private methods of Keras/TensorFlow/JAX classes that "
                       f"kadapt/_compat.py's PRIVATE_OVERRIDES does not declare: {sorted(found)}")
