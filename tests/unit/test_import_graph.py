"""compactord's modules import one another without a cycle, ``TYPE_CHECKING`` imports included.

The graph is read from the source with ``ast``, so it covers imports under ``if TYPE_CHECKING:`` and inside
functions, which a run-time check never sees; it is built from whatever modules the package holds.
"""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

import compactord

PACKAGE = "compactord"
ROOT = Path(compactord.__file__).resolve().parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, not ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The dotted name a ``from`` import of ``level`` dots names, written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its source: ``import a.b`` imports
    ``a.b``; ``from pkg import name`` imports ``pkg.name`` where that is a module, else ``pkg`` (whose
    ``__init__`` defines ``name``). The packages Python runs on the way to a module are not counted:
    a package that re-exports its own submodules is no cycle."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node.level, node.module)
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in modules:
                    found.add(target)
                elif source in modules:
                    found.add(source)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    names = set(files)
    return {name: imports_of(name, path, names) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of each strongly connected group of two or more modules: the shortest cycle through each
    of its modules, each cycle once."""
    edges = graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    found: list[list[str]] = []
    seen: set[frozenset[tuple[str, str]]] = set()
    for group in groups:
        for start in sorted(group):
            cycle = _cycle_through(start, group, edges)
            steps = frozenset(pairwise(cycle))
            if steps not in seen:
                seen.add(steps)
                found.append(cycle)
    return found


def _cycle_through(start: str, group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest cycle from ``start`` back to it within the strongly connected ``group``."""
    paths: dict[str, list[str]] = {start: [start]}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for succ in sorted(edges[node] & group):
                if succ == start:
                    return [*paths[node], start]
                if succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles among compactord's modules:\n" + "\n".join(
        " -> ".join(cycle) for cycle in found)


# The layers, lowest first: a module imports its own layer and those below it, never one above. The modules
# are named by the first part of their name below ``compactord``; every one has a layer (a test checks it),
# the package's ``__init__`` (the public surface, which re-exports from several layers) aside.
LAYERS: dict[str, int] = {
    # the leaves: errors, settings, plain data, the plug-in interfaces
    **dict.fromkeys(("errors", "config", "config_keys", "config_load", "config_values", "properties",
                     "event_time", "refs", "model", "task", "task_report", "interfaces"), 0),
    # the stores, the broker (the bundled one too), the cluster's membership and the daemon's HTTP client
    **dict.fromkeys(("storage", "ledger", "kafka", "cluster", "embedded", "client"), 1),
    # one run, and the readers of its ledgers (the Kafka listener too, which the daemon's runner starts; the Iceberg
    # table's publisher)
    **dict.fromkeys(("engine", "compacted_reader", "listener", "iceberg"), 2),
    "daemon": 3,
    "api": 4,
    # the process: uvicorn serving the API, signals, exit codes
    "server": 5,
    # the commands
    **dict.fromkeys(("cli", "cli_tables", "demo", "config_reference", "__main__"), 6),
}


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import into a layer above the importing module's."""
    found = []
    for module, targets in sorted(graph.items()):
        rank = layer_of(module)
        if rank is None:
            continue
        found += [f"{module} -> {target}" for target in sorted(targets)
                  if (above := layer_of(target)) is not None and above > rank]
    return found


def test_no_module_imports_a_layer_above_its_own() -> None:
    found = upward_imports(import_graph())
    assert not found, "imports against the layering (LAYERS, lowest first):\n" + "\n".join(found)


def test_every_module_has_a_layer() -> None:
    unranked = sorted(name for name in module_files() if name != PACKAGE and layer_of(name) is None)
    assert not unranked, f"modules without a layer (add them to LAYERS): {unranked}"


def engine_imports_of_the_daemon(graph: dict[str, set[str]]) -> list[str]:
    """Each import of an engine module by a daemon module: the daemon reaches the engine only through what
    ``compactord.interfaces`` declares (the factory, its services, their protocols), so that a factory
    named in the config replaces the whole engine."""
    return [f"{module} -> {target}" for module, targets in sorted(graph.items())
            if module.startswith(f"{PACKAGE}.daemon.") or module == f"{PACKAGE}.daemon"
            for target in sorted(targets) if target.startswith(f"{PACKAGE}.engine.") or target == f"{PACKAGE}.engine"]


def test_the_daemon_imports_no_engine_module() -> None:
    found = engine_imports_of_the_daemon(import_graph())
    assert not found, "the daemon imports the engine (declare what it needs in compactord.interfaces):\n" + \
        "\n".join(found)


def test_an_engine_import_of_the_daemon_is_named() -> None:
    graph = {"compactord.daemon.core": {"compactord.engine.spark_session", "compactord.interfaces"},
             "compactord.daemon": {"compactord.engine"}, "compactord.api.app": {"compactord.engine.factory"},
             "compactord.daemonic": {"compactord.engine.job"}}
    assert engine_imports_of_the_daemon(graph) == ["compactord.daemon -> compactord.engine",
                                                   "compactord.daemon.core -> compactord.engine.spark_session"]


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The walk itself, on a package made for it: an import under ``TYPE_CHECKING``, one inside a
    function, a relative one and a ``from pkg import submodule`` each make an edge, and the cycle they
    close is named."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..sub.c import x\n")
    (pkg / "sub" / "c.py").write_text("from compactord import a\n")
    files = module_files(pkg)
    graph = {name: imports_of(name, path, set(files)) for name, path in files.items()}
    assert graph["compactord.a"] == {"compactord.sub.b"}
    assert graph["compactord.sub.b"] == {"compactord.sub.c"}
    assert cycles(graph) == [["compactord.a", "compactord.sub.b", "compactord.sub.c", "compactord.a"]]


def test_an_upward_import_is_named() -> None:
    graph = {"compactord.engine.run": {"compactord.daemon.core", "compactord.model"},
             "compactord.kafka.admin": {"compactord.engine.job"}, "compactord.daemon.server": {"compactord.api.app"},
             "compactord.server": {"compactord.api.app", "compactord.daemon.core"}, "compactord.cli": {"compactord"}}
    assert upward_imports(graph) == ["compactord.daemon.server -> compactord.api.app",
                                     "compactord.engine.run -> compactord.daemon.core",
                                     "compactord.kafka.admin -> compactord.engine.job"]


# The store backends are made in ``compactord/storage`` alone; every other module asks a store what it declares
# (``ObjectStore.local_root``, ``free_bytes``, ``check``, ...), never its type.
BACKENDS = {"LocalStore", "S3Store"}
BACKEND_MODULES = {f"{PACKAGE}.storage.local", f"{PACKAGE}.storage.s3", f"{PACKAGE}.storage.s3_client"}


def backend_uses(module: str, path: Path, modules: set[str]) -> list[str]:
    """Each place where ``module`` names a store backend (an import of its class or of its module, a use of
    the class, such as an ``isinstance`` against it), as ``module:line what``."""
    found = [f"{module} imports {target}" for target in sorted(imports_of(module, path, modules) & BACKEND_MODULES)]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names if alias.name in BACKENDS]
        elif isinstance(node, ast.Name):
            names = [node.id] if node.id in BACKENDS else []
        elif isinstance(node, ast.Attribute):
            names = [node.attr] if node.attr in BACKENDS else []
        else:
            names = []
        found += [f"{module}:{node.lineno} {name}" for name in names]
    return found


def backend_uses_outside_storage(files: dict[str, Path]) -> list[str]:
    names = set(files)
    return [use for module, path in sorted(files.items())
            if module != f"{PACKAGE}.storage" and not module.startswith(f"{PACKAGE}.storage.")
            for use in backend_uses(module, path, names)]


def test_no_module_outside_storage_names_a_store_backend() -> None:
    found = backend_uses_outside_storage(module_files())
    assert not found, "a store backend named outside compactord/storage (ask what the ObjectStore declares):\n" + \
        "\n".join(found)


def test_a_use_of_a_store_backend_is_named(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    (pkg / "storage").mkdir(parents=True)
    for name in ("__init__.py", "storage/__init__.py", "storage/local.py", "storage/s3.py"):
        (pkg / name).write_text("")
    (pkg / "storage" / "__init__.py").write_text("from compactord.storage.local import LocalStore\n")
    (pkg / "ledger.py").write_text("from compactord.storage import LocalStore\nimport compactord.storage.s3\n"
                                   "def f(x):\n    return isinstance(x, compactord.storage.s3.S3Store)\n")
    (pkg / "clean.py").write_text("from compactord.storage import ObjectStore\n")
    assert backend_uses_outside_storage(module_files(pkg)) == [
        "compactord.ledger imports compactord.storage.s3", "compactord.ledger:1 LocalStore",
        "compactord.ledger:4 S3Store"]
