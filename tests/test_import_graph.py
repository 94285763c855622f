"""kadapt's modules import in one direction: no import circle, no private name imported across modules.

The graph is read from the sources with `ast` (nothing is imported): an edge for every
`import` / `from ... import`, at module level or inside a function, to a module of kadapt.
"""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.backends("tensorflow", "jax")

PACKAGE = Path(__file__).resolve().parents[1] / "kadapt"
BACKENDS = ("kadapt.batching.tensorflow", "kadapt.batching.jax")
# The front's modules that pick a backend (docs/layout.md): one per concern.
SWITCHES = {"kadapt.batching.accumulating_train_step", "kadapt.batching.auto_micro_batch",
            "kadapt.batching.micro_batch_probe", "kadapt.batching.out_of_memory"}


def module_files(package=PACKAGE):
    """`{"kadapt.batching.probe": path, ...}` for every module and package of `package`."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports(name, path, modules):
    """`(modules imported, [(module, private name)])` of module `name` at `path`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges, private = set(), []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            edges |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    edges.add(f"{base}.{alias.name}")
                elif base in modules:
                    edges.add(base)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append((base, alias.name))
    edges.discard(name)
    return edges, private


def import_graph(modules):
    graph, private = {}, {}
    for name, path in modules.items():
        graph[name], found = imports(name, path, modules)
        if found:
            private[name] = found
    return graph, private


def circles(graph):
    """The import circles of `graph`: each a path `[a, b, ..., a]`, one per strongly connected set."""
    found, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        stack, path, on_path = [(start, iter(sorted(graph[start])))], [start], {start}
        while stack:
            node, successors = stack[-1]
            step = next(successors, None)
            if step is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif step in on_path:
                circle = path[path.index(step):] + [step]
                if not any(set(circle) <= set(known) for known in found):
                    found.append(circle)
            elif step not in done:
                stack.append((step, iter(sorted(graph[step]))))
                path.append(step)
                on_path.add(step)
    return found


def test_the_graph_reader_finds_a_circle_and_a_private_import(tmp_path):
    package = tmp_path / "kadapt"
    (package / "front").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "front" / "__init__.py").write_text("")
    (package / "front" / "dispatch.py").write_text("def run():\n    from kadapt.front import backend\n")
    (package / "front" / "backend.py").write_text("from kadapt.front.dispatch import _helper\n")
    (package / "front" / "leaf.py").write_text("from . import backend\n")
    graph, private = import_graph(module_files(package))
    assert graph["kadapt.front.leaf"] == {"kadapt.front.backend"}
    assert circles(graph) == [["kadapt.front.backend", "kadapt.front.dispatch", "kadapt.front.backend"]]
    assert private == {"kadapt.front.backend": [("kadapt.front.dispatch", "_helper")]}


def test_kadapt_has_no_import_circle():
    found = circles(import_graph(module_files())[0])
    assert not found, "import circles in kadapt/ (break each: move what both sides need to a leaf module): " + \
        "; ".join(" -> ".join(circle) for circle in found)


def test_no_private_name_is_imported_across_modules():
    _, private = import_graph(module_files())
    assert not private, "private names imported across modules (make them public or keep them home): " + \
        "; ".join(f"{name} imports {module}.{attribute}" for name, found in private.items()
                  for module, attribute in found)


def test_only_the_switches_import_a_backend_and_no_backend_imports_a_switch():
    graph, _ = import_graph(module_files())
    backend = {name for name in graph if name.startswith(BACKENDS)}
    front = {name for name in graph if name.startswith("kadapt.batching") and name not in backend}
    switches = {name for name in front if graph[name] & backend}
    assert switches == SWITCHES, f"front modules that import a backend: {sorted(switches)}; docs/layout.md names " \
        f"{sorted(SWITCHES)} (a new switch goes in both; a leaf must not pick a backend)"
    upward = sorted(f"{name} imports {target}" for name in backend for target in graph[name] & SWITCHES)
    assert not upward, f"backend modules import a switch of the front (import its leaves instead): {upward}"
