"""Dependencies point one way: ``pipelines`` may import ``ingest``; ``ingest`` never imports
Spark, Delta or ``pipelines``; notebooks hold no logic of their own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_INGEST = ("pyspark", "delta", "deltalake", "pipelines", "py4j", "pyarrow", "pandas")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_ingest_never_imports_spark_delta_or_pipelines() -> None:
    offenders = []
    for path in sorted((ROOT / "ingest").rglob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in FORBIDDEN_IN_INGEST:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "\n".join(offenders)


# The local engine works in Arrow schemas: a Spark schema given to LocalEngine is turned into
# Arrow there, once. local_views is left out: it writes Spark SQL for a Spark session.
LOCAL_ENGINE = (
    "local_maintenance",
    "local_reads",
    "local_sql",
    "local_tables",
    "local_writes",
    "direct_merge",
    "deltalog",
    "parquet_read",
    "writable",
)


def _spark_type_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("pyspark.sql.types")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("pyspark.sql.types"):
                found.append(node.module)
            elif node.module == "pyspark.sql" and any(a.name == "types" for a in node.names):
                found.append("pyspark.sql.types")
    return found


def test_local_engine_roles_never_see_spark_types() -> None:
    offenders = [
        f"pipelines/engines/{stem}.py imports {name}"
        for stem in LOCAL_ENGINE
        for name in _spark_type_imports(ROOT / "pipelines" / "engines" / f"{stem}.py")
    ]
    assert not offenders, "\n".join(offenders)


def test_library_code_never_configures_logging() -> None:
    offenders = []
    for package in ("ingest", "pipelines"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "cli.py":
                continue
            if "logging.basicConfig" in path.read_text():
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"only the CLI configures logging: {offenders}"


# ------------------------------------------------------------------------ the import graph

GRAPHED = ("ingest", "pipelines")


def _module_files() -> dict[str, Path]:
    """Every module under ``ingest/`` and ``pipelines/`` by dotted name (a package by its
    ``__init__.py``)."""
    modules: dict[str, Path] = {}
    for top in GRAPHED:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _targets(name: str, path: Path, tree: ast.Module, modules: dict[str, Path]) -> set[str]:
    """The modules of the graph ``name`` imports: every ``import`` and ``from ... import``,
    at module level or inside a function, relative ones resolved. ``from pkg import x`` counts
    as importing ``pkg.x`` where that is a module, and ``pkg`` (its ``__init__``) otherwise."""
    package = name if _is_package(path) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    found.add(submodule)
                elif source in modules:
                    found.add(source)
    return found


def _graph() -> tuple[dict[str, set[str]], dict[str, Path]]:
    modules = _module_files()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = _targets(name, path, tree, modules)
    return graph, modules


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, and modules that import
    themselves (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}, "f": set()}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["d"]]


def test_no_import_cycles() -> None:
    graph, modules = _graph()
    cycles = _cycles(graph)
    report = []
    for component in cycles:
        members = set(component)
        report.append(f"import cycle of {len(component)} module(s):")
        for name in component:
            into = sorted(members & graph[name])
            report.append(f"  {modules[name].relative_to(ROOT)} imports {', '.join(into)}")
    assert not cycles, "\n".join(report)


def _only_reexports(tree: ast.Module) -> bool:
    body = list(tree.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring

    def reexport(node: ast.stmt) -> bool:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return True
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        return bool(targets) and all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)

    return bool(body) and all(reexport(node) for node in body)


def test_only_package_inits_only_reexport() -> None:
    """A module that defines nothing and passes on names from others is a detour: its users
    import from the modules that define them (a package's ``__init__`` is its public face)."""
    offenders = []
    for path in _module_files().values():
        if _is_package(path):
            continue
        if _only_reexports(ast.parse(path.read_text(), filename=str(path))):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"modules that only re-export names: {offenders}"
