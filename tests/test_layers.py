"""The import direction: a module imports its own layer or a lower one, never a higher one, and
no two folders (or top-level modules) import each other in a loop.

The layers are the data path's order, from the building blocks every part uses up to the
command line (``docs/architecture.md``, "Layers"). Every import counts, the ones inside
functions too: a lazy import runs as surely as a top-level one, it only runs later. Each module
is read with ``ast``, nothing is imported, so the test also holds for optional extras (Ray)
that are not installed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "impala_gpu"

# Bottom to top. A name is a folder of the package or a module at its top level; "" is the
# package's own __init__.py (the version). A new folder or top-level module must be placed
# here: the test fails until it is.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("building blocks", ("", "config", "speed", "telemetry", "interrupts")),
    ("data-path parts", ("envs", "models", "rl", "channels")),
    ("actors and learners", ("acting", "learning")),
    (
        "around a run",
        (
            "reporting",
            "lifecycle",
            "calibration",
            "validate",
            "validate_inputs",
            "validate_sizes",
            "resources",
            "overrides",
            "sweep",
            "analysis",
        ),
    ),
    ("algorithms", ("algos", "evaluate")),
    ("command line", ("cli", "cli_help", "__main__")),
    ("reports on archived runs", ("reports",)),
)


@dataclass(frozen=True)
class Import:
    """One import statement of ``path``, at ``line``, of the package's module ``target``."""

    path: Path
    line: int
    text: str
    target: str  # dotted, without the leading "impala_gpu"


def module_name(path: Path, package: Path) -> str:
    """``impala_gpu/models/torsos.py`` -> ``models.torsos``; ``__init__.py`` -> its folder."""
    parts = path.relative_to(package).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_module(name: str, package: Path) -> bool:
    """Whether ``name`` (dotted, under the package) is a module file or a folder of it."""
    base = package.joinpath(*name.split(".")) if name else package
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path, package: Path) -> list[Import]:
    """Every import of the package in ``path``: top-level, in functions, under TYPE_CHECKING,
    relative ones resolved. ``from impala_gpu.x import y`` targets ``x.y`` when y is a module,
    else ``x``."""
    name = module_name(path, package)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == package.name]
            targets = [t.removeprefix(package.name).lstrip(".") for t in targets]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x, from ..y import z
                base = here[: len(here) - node.level + 1] if node.level > 1 else here
                source = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and node.module.split(".")[0] == package.name:
                source = node.module.removeprefix(package.name).lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}" if source else alias.name
                targets.append(sub if is_module(sub, package) else source)
        out += [Import(path, node.lineno, ast.unparse(node), t) for t in targets]
    return out


def unit(name: str) -> str:
    """The folder or top-level module a dotted module name belongs to."""
    return name.split(".")[0]


def layer_of() -> dict[str, int]:
    return {u: i for i, (_, units) in enumerate(LAYERS) for u in units}


def package_modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "conf" not in p.relative_to(package).parts)


def upward_imports(package: Path) -> list[str]:
    """One line per import that runs from a lower layer to a higher one, and per module whose
    folder is in no layer."""
    layers, problems = layer_of(), []
    for path in package_modules(package):
        here = unit(module_name(path, package))
        rel = path.relative_to(package.parent)
        if here not in layers:
            problems.append(f"{rel}: {here!r} is in no layer: place it in LAYERS")
            continue
        for imp in imports_of(path, package):
            there = unit(imp.target)
            if there in layers and layers[there] > layers[here]:
                problems.append(
                    f"{rel}:{imp.line}: `{imp.text}` imports {there or 'impala_gpu'} "
                    f"({LAYERS[layers[there]][0]}) from {here} ({LAYERS[layers[here]][0]})"
                )
    return problems


def unit_graph(package: Path) -> dict[str, dict[str, Import]]:
    """Folder -> folder it imports -> the first import that does it."""
    graph: dict[str, dict[str, Import]] = {}
    for path in package_modules(package):
        here = unit(module_name(path, package))
        for imp in imports_of(path, package):
            there = unit(imp.target)
            if there != here:
                graph.setdefault(here, {}).setdefault(there, imp)
    return graph


def loops(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The groups of folders in ``graph`` that import each other in a loop (its strongly
    connected components of more than one, by Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [sorted(g) for g in groups]


def _walk(graph: dict[str, dict[str, Import]], group: list[str]) -> list[str]:
    """A shortest loop from the group's first member back to it, inside the group."""
    start, paths = group[0], {group[0]: [group[0]]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph.get(v, {}):
                if w == start:
                    return [*paths[v], start]
                if w in group and w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no loop through {group}")


def loop_text(graph: dict[str, dict[str, Import]], group: list[str], package: Path) -> str:
    """The group, and one loop through it with the import of each step."""
    walk, steps = _walk(graph, group), []
    for a, b in zip(walk, walk[1:], strict=False):
        imp = graph[a][b]
        steps.append(f"  {imp.path.relative_to(package.parent)}:{imp.line}: `{imp.text}`")
    return f"{', '.join(group)}; one loop: {' -> '.join(walk)}:\n" + "\n".join(steps)


def test_every_layer_name_is_a_folder_or_module():
    missing = [u for _, units in LAYERS for u in units if not is_module(u, PACKAGE)]
    assert not missing, f"LAYERS names what the package no longer has: {missing}"


def test_no_import_runs_up_the_layers():
    problems = upward_imports(PACKAGE)
    assert not problems, "imports against the layers (lower -> higher):\n" + "\n".join(problems)


def test_no_folders_import_each_other_in_a_loop():
    graph = unit_graph(PACKAGE)
    found = [loop_text(graph, group, PACKAGE) for group in loops(graph)]
    assert not found, "folders that import each other in a loop:\n" + "\n".join(found)


def test_the_reader_sees_lazy_and_relative_imports(tmp_path):
    """What the checks stand on: an import inside a function, and a relative one, are read."""
    pkg = tmp_path / "impala_gpu"
    (pkg / "models").mkdir(parents=True)
    (pkg / "reporting").mkdir()
    for folder in (pkg, pkg / "models", pkg / "reporting"):
        (folder / "__init__.py").write_text("")
    (pkg / "reporting" / "health.py").write_text("X = 1\n")
    (pkg / "models" / "torsos.py").write_text(
        "def f():\n    from ..reporting import health\n    return health\n"
    )
    (pkg / "models" / "policy.py").write_text("from . import torsos\n")
    torsos = imports_of(pkg / "models" / "torsos.py", pkg)
    assert [(i.line, i.target) for i in torsos] == [(2, "reporting.health")]
    assert [i.target for i in imports_of(pkg / "models" / "policy.py", pkg)] == ["models.torsos"]
    problems = upward_imports(pkg)
    assert len(problems) == 1 and "models/torsos.py:2:" in problems[0], problems
    graph = {"a": {"b": torsos[0]}, "b": {"a": torsos[0]}, "c": {"a": torsos[0]}}
    assert loops(graph) == [["a", "b"]]
    assert _walk(graph, ["a", "b"]) == ["a", "b", "a"]
