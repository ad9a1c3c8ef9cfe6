"""The checks .ci/run adds around the tests: the size budget (tools/check_size.py) and the switch that turns
skips for a missing optional dependency into failures (TRTOPT_REQUIRE_OPTIONAL=1, tests/require_optional.py);
and README's layout table against the package (issue #17: the layout table matches the house)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_size  # noqa: E402

MODULE = '''\
"""A module."""


def short():
    return 1


class Box:
    @staticmethod
    def long():
        def inner():
            return 2
''' + "        x = 1\n" * 70 + '''\
        return inner
'''


def test_units_count_modules_functions_decorators_and_nested_functions(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(MODULE)
    lengths = {u.name: u.lines for u in check_size.units(path, "m.py")}
    assert lengths[None] == len(MODULE.splitlines())
    assert lengths["short"] == 2
    assert lengths["Box.long"] == 2 + 2 + 70 + 1  # decorator and def, inner, the body, return
    assert lengths["Box.long.inner"] == 2


def test_findings_allow_list_and_stale_entries(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(MODULE)
    units = list(check_size.units(path, "m.py"))
    assert check_size.findings(units, {}) == ["m.py:Box.long: 75 lines, budget 60 (function)"]
    assert check_size.findings(units, {"m.py:Box.long": "generated"}) == []
    stale = check_size.findings(units, {"m.py:Box.long": "generated", "m.py:short": "x", "gone.py": "y"})
    assert stale == [
        "m.py:short: in the allow-list but within budget now; remove the entry",
        "gone.py: in the allow-list but no such module or function; remove the entry",
    ]


def test_an_allow_list_entry_needs_a_reason(tmp_path: Path) -> None:
    allowlist = tmp_path / "allow.txt"
    allowlist.write_text("# comment\n\nm.py:Box.long   # no reason given\n")
    with pytest.raises(SystemExit, match="has no reason"):
        check_size.read_allowlist(allowlist)
    allowlist.write_text("m.py:Box.long generated code  # a comment\n")
    assert check_size.read_allowlist(allowlist) == {"m.py:Box.long": "generated code"}


def test_the_repository_keeps_its_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_size.main([]) == 0, capsys.readouterr().out


SKIPS = '''\
import pytest
from require_optional import missing


def test_raw_importorskip():
    pytest.importorskip("trtopt_no_such_module")


def test_worded_skip():
    pytest.importorskip("trtopt_no_such_module", reason=missing("trtopt_no_such_module", "a test"))


def test_other_skip():
    pytest.skip("needs models/efficientnet_lite0.onnx")
'''


@pytest.mark.parametrize(("switch", "expected"), [("0", "3 skipped"), ("1", "2 failed, 1 skipped")])
def test_require_optional_fails_only_missing_dependency_skips(tmp_path: Path, switch: str, expected: str) -> None:
    (tmp_path / "test_skips.py").write_text(SKIPS)
    env = {**os.environ, "TRTOPT_REQUIRE_OPTIONAL": switch, "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "require_optional", "-p", "no:cacheprovider", "test_skips.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert expected in done.stdout, done.stdout
    if switch == "1":
        assert "TRTOPT_REQUIRE_OPTIONAL=1 but an optional dependency is missing" in done.stdout


def test_readme_layout_names_every_part_of_the_package() -> None:
    """README's "Repository layout" table lists every package under trtopt/ and every top-level module."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Repository layout", 1)[1].split("\n## ", 1)[0]
    packages = [f"trtopt/{p.name}" for p in (ROOT / "trtopt").iterdir() if (p / "__init__.py").is_file()]
    modules = [f"{p.name}" for p in (ROOT / "trtopt").glob("*.py") if p.name != "__init__.py"]
    missing = [name for name in [*packages, *modules] if f"`{name}`" not in layout and f"/{name}`" not in layout]
    assert not missing, f"README's layout table does not mention {missing}"
