"""Enforce the size budget: every module at most 400 lines, every function at most 60.

    python tools/check_size.py [PATH ...]          # default: trtopt/ and tools/

Lines are counted the way a reader meets them: a module's physical lines, a function's lines from its
`def` (decorators included) to its last line, nested functions counted within their parent and on
their own. The budget (STYLE.md "Small units"; tinygrad enforces its own line budget in CI) is a
symptom check: a unit that outgrows it is usually two ideas. An exception needs a line in
tools/size_allowlist.txt, `path[:function] reason`, with a reason; an entry that no longer exceeds
the budget, or names nothing, is reported too, so the list only shrinks. Exit status 1 on any finding.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
DEFAULT_PATHS = ("trtopt", "tools")
ALLOWLIST = ROOT / "tools" / "size_allowlist.txt"


@dataclass(frozen=True)
class Unit:
    """A module (`name` None) or a function (`name` its qualified name) and its length in lines."""

    path: str
    name: str | None
    lines: int

    @property
    def key(self) -> str:
        return self.path if self.name is None else f"{self.path}:{self.name}"

    @property
    def limit(self) -> int:
        return MAX_MODULE_LINES if self.name is None else MAX_FUNCTION_LINES


def units(path: Path, shown: str) -> Iterator[Unit]:
    """The module and every function in it, with their lengths."""
    source = path.read_text(encoding="utf-8")
    yield Unit(shown, None, len(source.splitlines()))
    yield from _functions(ast.parse(source, filename=shown), shown, "")


def _functions(node: ast.AST, shown: str, prefix: str) -> Iterator[Unit]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
            name = f"{prefix}{child.name}"
            yield Unit(shown, name, (child.end_lineno or child.lineno) - first + 1)
            yield from _functions(child, shown, f"{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, shown, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, shown, prefix)


def python_files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def read_allowlist(path: Path) -> dict[str, str]:
    """`path[:function] reason` per line; blank lines and # comments are skipped. A line without a reason
    is an error: an exception has to say why it is one."""
    allowed: dict[str, str] = {}
    if not path.exists():
        return allowed
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{path.name}:{number}: {key!r} has no reason; write `{key} <why it is allowed>`")
        allowed[key] = reason.strip()
    return allowed


def findings(all_units: list[Unit], allowed: dict[str, str]) -> list[str]:
    """Units over budget and not allowed, and allow-list entries that are stale."""
    over = {u.key: u for u in all_units if u.lines > u.limit}
    found = [
        f"{u.key}: {u.lines} lines, budget {u.limit} ({'module' if u.name is None else 'function'})"
        for key, u in over.items()
        if key not in allowed
    ]
    known = {u.key for u in all_units}
    for key in allowed:
        if key not in known:
            found.append(f"{key}: in the allow-list but no such module or function; remove the entry")
        elif key not in over:
            found.append(f"{key}: in the allow-list but within budget now; remove the entry")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders (default: trtopt/ and tools/)")
    parser.add_argument("--allowlist", type=Path, default=ALLOWLIST, help="exceptions, one per line with a reason")
    args = parser.parse_args(argv)
    paths = args.paths or [ROOT / p for p in DEFAULT_PATHS]
    all_units = [u for f in python_files(paths) for u in units(f, _shown(f))]
    problems = findings(all_units, read_allowlist(args.allowlist)) if all_units else ["no Python files found"]
    for line in problems:
        print(line)
    modules = sum(u.name is None for u in all_units)
    print(f"size budget: {modules} modules, {len(all_units) - modules} functions, {len(problems)} finding(s)")
    return 1 if problems else 0


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


if __name__ == "__main__":
    sys.exit(main())
