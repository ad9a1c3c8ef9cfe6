"""A pytest plugin (loaded by conftest.py): with TRTOPT_REQUIRE_OPTIONAL=1, a test or test module skipped
because an optional dependency is missing fails instead, so a CI that installed the extras cannot pass
by skipping (like TRTOPT_REQUIRE_GPU for GPU tests and TRTOPT_REQUIRE_TRT_BINDINGS for the TensorRT
bindings).

A skip counts as a missing optional dependency when its reason starts with one of `MISSING_DEPENDENCY`:
pytest.importorskip's own wording ("could not import 'x': ..."), or "missing optional dependency", the
wording the suite's own skips use (`pytest.importorskip("x", reason=missing("x", "what it is for"))`).
Other skips (no GPU, no demo model in the checkout, a TensorRT 10 rerun) are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

SWITCH = "TRTOPT_REQUIRE_OPTIONAL"
MISSING_DEPENDENCY = ("could not import", "missing optional dependency")
INSTALL_HINT = "pip install -e '.[dev]'"


def missing(module: str, needed_for: str) -> str:
    """The skip reason for a missing optional dependency, in the wording the switch recognises."""
    return f"missing optional dependency {module}: {needed_for} ({INSTALL_HINT})"


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_if_required(report: pytest.TestReport | pytest.CollectReport) -> None:
    if os.environ.get(SWITCH) != "1" or not report.skipped:
        return
    reason = _skip_reason(report)
    if reason.startswith(MISSING_DEPENDENCY):
        report.outcome = "failed"
        report.longrepr = f"{SWITCH}=1 but an optional dependency is missing: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _fail_if_required(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _fail_if_required(outcome.get_result())
