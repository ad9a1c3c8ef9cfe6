"""The house's layering (docs/architecture.md): imports in `trtopt/` point one way, from the CLI down to the shared
types, and no module reaches itself through its imports.

The import graph is read from the code with `ast`, as a static reader sees it: module-level imports, imports inside
functions, and imports under `if TYPE_CHECKING:` all count (a typing-only arrow is still a dependency a reader
must follow). Importing `a.b.c` also runs `a/__init__.py` and `a/b/__init__.py`; those implicit arrows count too,
except into the importer's own packages (Python has started running those already).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "trtopt"

# The floors, from the ground up: a module may import its own floor and the floors below it, never one above.
# Each name is a top-level module or package of `trtopt` ("trtopt" is the package's own `__init__`).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("_version", "registry", "config_checks", "memory", "log_once"),  # shared types and checks
    ("frontend",),  # ONNX -> onnx-graphsurgeon IR, IR edits, model checks
    ("execution",),  # ONNX Runtime sessions, device arrays
    ("data",),  # images, arrays, preprocessing, calibration and verification samples
    ("metrics",),  # fidelity figures between two runs' outputs (pure numpy)
    ("passes",),  # graph passes, load_graph, the graph check
    ("calib",),  # histograms and thresholds
    ("quant",),  # Q/DQ placement and insertion, equalisation, bias correction
    ("precision",),  # FP16 conversion
    ("plan",),  # the plan file, its metadata and verification record
    ("backend",),  # the backends: build plan sections, run plans
    ("analysis",),  # what `inspect` and the build report of a graph
    ("verify",),  # every plan checks itself against its Q/DQ reference and FP32
    ("search",),  # the sensitivity search (trials are verified plans)
    ("auto_backend",),  # `--backend auto` among the installed CPU runtimes: each built, verified and timed
    ("build", "quantize", "plan_records"),  # the chain of stages, its quantisation chain, what the plan records
    ("engine", "bench", "trtopt"),  # the public runtime API
    ("sparsify", "serving", "zoo"),  # tools beside the pipeline
    ("cli", "__main__"),
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every `trtopt` module or name this module imports, wherever the import statement stands."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules it imports (explicitly, or by running their packages' `__init__`)."""
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for name in imported_names(ast.parse(path.read_text(encoding="utf-8")), module, path.name == "__init__.py"):
            if not name.startswith("trtopt"):
                continue
            while name not in paths and "." in name:  # `from pkg.mod import name` -> pkg.mod
                name = name.rsplit(".", 1)[0]
            if name not in paths:
                continue
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # the packages an import runs, then the module itself
                target = ".".join(parts[:depth])
                if target != module and not module.startswith(target + "."):
                    targets.add(target)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "trtopt"


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} -> {target} (floor {FLOOR[stage(module)]} -> {FLOOR[stage(target)]})"
        for module, targets in graph.items()
        for target in targets
        if FLOOR[stage(target)] > FLOOR[stage(module)]
    )


def test_every_module_of_the_package_stands_on_a_declared_floor() -> None:
    stages = {stage(module) for module in import_graph()}
    assert stages - set(FLOOR) == set(), "add the new package or module to FLOORS (and to docs/architecture.md)"
    assert set(FLOOR) - stages == set(), "a floor names a module that is gone"


def test_there_is_no_import_circle_in_the_package() -> None:
    assert circles(import_graph()) == []


def test_no_import_runs_up_a_floor() -> None:
    assert upward_arrows(import_graph()) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"a.py": "from trtopt import b", "b.py": "def f():\n    from trtopt.a import x"}, [["trtopt.a", "trtopt.b"]]),
        ({"a.py": "import typing\nif typing.TYPE_CHECKING:\n    from trtopt.b import B", "b.py": "import trtopt.a"},
         [["trtopt.a", "trtopt.b"]]),  # fmt: skip
        ({"p/__init__.py": "from trtopt.p.m import x", "p/m.py": "from trtopt.p.n import y", "p/n.py": ""}, []),
        ({"p/__init__.py": "from trtopt.q import x", "q.py": "from trtopt.p.m import y", "p/m.py": ""},
         [["trtopt.p", "trtopt.q"]]),  # running p/__init__ to reach p.m closes the loop  # fmt: skip
    ],
    ids=["lazy-import", "type-checking-import", "package-own-init", "implicit-init"],
)
def test_the_checker_finds_the_circles_python_would_run(tmp_path: Path, files: dict[str, str], expected) -> None:  # type: ignore[no-untyped-def]
    package = tmp_path / "trtopt"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert circles(import_graph(package)) == expected


def test_the_checker_reports_an_arrow_that_runs_up() -> None:
    graph = {"trtopt.quant.qdq": {"trtopt.verify"}, "trtopt.verify": {"trtopt.quant"}}
    assert upward_arrows(graph) == ["trtopt.quant.qdq -> trtopt.verify (floor 8 -> 13)"]
