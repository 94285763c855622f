"""kadapt's modules and packages import in one direction: no import circle, no private name imported across modules.

The graph is read from the sources with `ast` (nothing is imported): an edge for every
`import` / `from ... import`, at module level or inside a function, to a module of kadapt.

At the package level a node is a top-level package of `kadapt/` (`kadapt.meta`, with all its
sub-packages) or a top-level module (`kadapt.validation`); no package imports another that
imports it back (STYLE.md 12: code one needs from the other belongs beside it, or in a leaf).
The entry points, `kadapt` itself (`kadapt/__init__.py`, the public list, which reaches every
package through its lazy names), `kadapt.__main__` and `kadapt.cli`, may import anything, and
nothing in the library imports them: a package that imported `kadapt` would import itself back.
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


def import_sites(name, path, modules):
    """`(module imported, line, attribute)` for each import of a kadapt module in module `name` at
    `path`; `attribute` is the name imported from that module (`from m import x`), else `None`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno, None) for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    yield f"{base}.{alias.name}", node.lineno, None
                elif base in modules:
                    yield base, node.lineno, alias.name


def imports(name, path, modules):
    """`(modules imported, [(module, private name)])` of module `name` at `path`."""
    edges, private = set(), []
    for module, _, attribute in import_sites(name, path, modules):
        edges.add(module)
        if attribute and attribute.startswith("_") and not attribute.startswith("__"):
            private.append((module, attribute))
    edges.discard(name)
    return edges, private


def import_graph(modules):
    graph, private = {}, {}
    for name, path in modules.items():
        graph[name], found = imports(name, path, modules)
        if found:
            private[name] = found
    return graph, private


ENTRY_POINTS = ("kadapt", "kadapt.__main__", "kadapt.cli")


def package_of(module):
    """`kadapt.meta.live.adjuster` -> `kadapt.meta`; a top-level module, and `kadapt`, are their own."""
    return ".".join(module.split(".")[:2])


def package_graph(modules, root=PACKAGE.parent):
    """`{package: {package it imports: ["kadapt/x/y.py:12", ...]}}`: where each import across packages is."""
    graph = {package_of(name): {} for name in modules}
    for name, path in modules.items():
        for module, line, _ in import_sites(name, path, modules):
            if package_of(module) != package_of(name):
                sites = graph[package_of(name)].setdefault(package_of(module), [])
                sites.append(f"{path.relative_to(root).as_posix()}:{line}")
    return graph


def described(circle, graph, shown=3):
    """`a -> b -> a` with the imports that make each step: `a -> b (a/x.py:3, a/y.py:9) -> a (b/z.py:1)`;
    past `shown` imports a step, how many more."""
    steps = []
    for source, target in zip(circle, circle[1:]):
        sites = sorted(graph[source][target], key=lambda site: (site.rpartition(":")[0], int(site.rpartition(":")[2])))
        more = [f"{len(sites) - shown} more"] if len(sites) > shown else []
        steps.append(f"{target} ({', '.join(sites[:shown] + more)})")
    return " -> ".join([circle[0], *steps])


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


def test_the_package_reader_finds_a_circle_and_where_its_imports_are(tmp_path):
    package = tmp_path / "kadapt"
    (package / "front" / "inner").mkdir(parents=True)
    (package / "back").mkdir()
    (package / "__init__.py").write_text("")
    for room in ("front", "front/inner", "back"):
        (package / room / "__init__.py").write_text("")
    (package / "front" / "inner" / "step.py").write_text("import os\n\ndef run():\n    from kadapt.back import store\n")
    (package / "back" / "store.py").write_text("from kadapt.front.inner import step\n")
    (package / "leaf.py").write_text("from kadapt import back\n")
    graph = package_graph(module_files(package), tmp_path)
    assert graph["kadapt.leaf"] == {"kadapt.back": ["kadapt/leaf.py:1"]}
    assert graph["kadapt.front"] == {"kadapt.back": ["kadapt/front/inner/step.py:4"]}
    found = circles(graph)
    assert [described(circle, graph) for circle in found] == [
        "kadapt.back -> kadapt.front (kadapt/back/store.py:1) -> kadapt.back (kadapt/front/inner/step.py:4)"]


def test_no_package_imports_another_that_imports_it_back():
    graph = package_graph(module_files())
    found = circles(graph)
    assert not found, "packages of kadapt/ that import each other back (move the code one needs from the " \
        "other beside it, or into a leaf both import): " + "; ".join(described(circle, graph) for circle in found)


def test_nothing_in_the_library_imports_an_entry_point():
    graph = package_graph(module_files())
    found = sorted(f"{source} imports {target} ({', '.join(sites)})" for source, targets in graph.items()
                   if source not in ENTRY_POINTS for target, sites in targets.items() if target in ENTRY_POINTS)
    assert not found, f"library modules import an entry point ({', '.join(ENTRY_POINTS)}): {found}"


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


# docs/layout.md's picture of kadapt/meta: each room and the rooms it may import.
META_ROOMS = {"live": {"start", "observe", "model"}, "records": {"start", "observe", "model"},
              "start": {"model"}, "observe": {"model"}, "model": set()}


def meta_room(module):
    """`kadapt.meta.live.adjuster` -> `"live"`; `None` outside a room of kadapt/meta."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["kadapt", "meta"] and len(parts) > 2 else None


def test_the_rooms_of_meta_import_down_the_picture():
    modules = module_files()
    assert {meta_room(name) for name in modules} - {None} == set(META_ROOMS), \
        "kadapt/meta's rooms changed: redraw docs/layout.md's picture and META_ROOMS here"
    upward = []
    for name, path in modules.items():
        room = meta_room(name)
        for module, line, _ in import_sites(name, path, modules) if room else ():
            if module == "kadapt.meta" or meta_room(module) not in {None, room, *META_ROOMS[room]}:
                upward.append(f"{name} imports {module} ({path.relative_to(PACKAGE.parent).as_posix()}:{line})")
    assert not upward, f"kadapt/meta's rooms import against docs/layout.md's picture: {upward}"
