"""Shared test setup: the `gpu` marker skips with the reason where there is no GPU/TensorRT, and fails
with that reason when TRTOPT_REQUIRE_GPU=1 (so a GPU CI cannot pass by skipping).

``@pytest.mark.gpu`` needs TensorRT and a GPU; ``@pytest.mark.gpu(tensorrt=False)`` needs only CUDA
(cuda-bindings and a GPU): the runtime's CUDA layer is checked there without TensorRT.

TRTOPT_REQUIRE_OPTIONAL=1 fails the tests skipped for a missing optional dependency (require_optional.py).
The `light_graph` fixture loads each light model (trtopt.zoo.light) once per session; `demo_plan` builds the demo
model's INT8 CPU plan once per run, shared by the xdist workers.

CPU builds keep the INT8 plan they verified, whatever the build's rough timing says (`trtopt.backend.cpu.choice`
would write a cheaper plan where INT8 runs slower than FP32, which on a busy or VNNI-less machine depends on the
timing): a test module that sets `SPEED_CHOICE = True` tests that choice, with injected timings. For the same
reason `--backend auto` builds only the CPU backend's plan here (TRTOPT_AUTO_BACKENDS=cpu), not one per installed CPU
runtime timed against each other (`trtopt.auto_backend`, tested with injected timings in test_backend_openvino).

ONNX Runtime sessions opened without a thread count run on one intra-op thread here, without spinning
(`_one_ort_thread_per_worker`): the suite runs two xdist workers on CI's two cores."""

from __future__ import annotations

import fcntl
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from require_optional import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (hooks)

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

os.environ.setdefault("TRTOPT_AUTO_BACKENDS", "cpu")  # inherited by the CLI subprocesses too


@pytest.fixture(scope="session")
def light_graph() -> Callable[[str], gs.Graph]:
    """light:NAME as a gs.Graph (`graph_from_onnx(light_model(NAME))`), converted once per session; the
    graph is shared, so copy it (as `optimize` does) before changing it."""
    from trtopt.frontend import graph_from_onnx
    from trtopt.zoo.light import light_model

    return functools.cache(lambda name: graph_from_onnx(light_model(name)))


@pytest.fixture(scope="session")
def demo_plan(tmp_path_factory: pytest.TempPathFactory, _int8_plans_stay_int8: object) -> Path:
    """models/efficientnet_lite0.onnx as an INT8 CPU plan calibrated on 16 calib_data photos (the build's defaults
    otherwise), built once per run: the xdist workers of one run share their temporary root, and the first to
    take the lock builds it (tests/test_http_service.py and tests/test_triton_server.py serve it). Read it only."""
    from trtopt.build import BuildConfig, build_plan
    from trtopt.data import DataConfig
    from trtopt.plan import write_plan

    root = Path(__file__).resolve().parents[1]
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's root under xdist
    plan = shared / "demo-int8-16.engine"
    with open(shared / "demo-int8-16.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not plan.is_file():
            config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(root / "calib_data"),), count=16))
            partial = shared / "demo-int8-16.engine.partial"
            write_plan(build_plan(root / "models" / "efficientnet_lite0.onnx", config).plan, partial)
            partial.rename(plan)
    return plan


@pytest.fixture(scope="session", autouse=True)
def _int8_plans_stay_int8() -> Iterator[Callable[..., object]]:
    """Session-wide (module fixtures build plans before any function fixture runs); yields the real choice."""
    from trtopt.backend.cpu import choice

    measured = choice.keep_faster
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(choice, "keep_faster", lambda first, *args: first)
        yield measured


@pytest.fixture(scope="session", autouse=True)
def _speed_figures_in_few_rounds() -> Iterator[None]:
    """The speed figure every CPU INT8 build reports (`trtopt.backend.cpu.speed`) from one call of each, without
    warm-up, not its 2-second budget: no test reads its value (the choice it feeds is fixed above or given injected
    timings), and the budget, then its fewest rounds (5 calls of each on the verification batch), cost seconds per
    build of a large model. tests/test_cpu_speed.py sets the real rounds back for its own tests."""
    from trtopt.backend.cpu import speed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(speed, "BUDGET_S", 0.0)
        patch.setattr(speed, "MIN_ROUNDS", 1)
        patch.setattr(speed, "WARMUP", 0)
        yield


@pytest.fixture(scope="session", autouse=True)
def _one_ort_thread_per_worker() -> Iterator[None]:
    """A session given no thread count (`threads=None`: ONNX Runtime's pool of one thread per core) gets one intra-op
    thread, and no session's threads spin after a run. The suite runs two xdist workers on two cores: each worker's
    pools of two threads oversubscribed the CPU, and a thread spinning for its pool's next run took the time the
    other worker needed (tests/test_demo_model.py's INT8 build on a loaded machine, measured once: 29 CPU-s with them,
    25 without; the whole suite: 1,273 CPU-s before this and the tool changes of the same commit, 1,150 after). No test
    reads the thread count or depends on it; a session given a thread count keeps it."""
    from trtopt.backend.cpu import builder, runner
    from trtopt.execution import ort_session

    default = ort_session.session_options

    def one_thread(*, threads: int | None = None, spin: bool = True, **options: Any) -> Any:
        return default(threads=1 if threads is None else threads, spin=False, **options)

    with pytest.MonkeyPatch.context() as patch:
        for module in (ort_session, runner, builder):  # each holds its own reference to the function
            patch.setattr(module, "session_options", one_thread)
        yield


@pytest.fixture(scope="module", autouse=True)
def _speed_choice(request: pytest.FixtureRequest, _int8_plans_stay_int8: Callable[..., object]) -> Iterator[None]:
    from trtopt.backend.cpu import choice

    with pytest.MonkeyPatch.context() as patch:
        if getattr(request.module, "SPEED_CHOICE", False):
            patch.setattr(choice, "keep_faster", _int8_plans_stay_int8)
        yield


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("gpu")
    if marker is None:
        return
    from trtopt.backend.tensorrt.detect import cuda_status, tensorrt_status

    if marker.kwargs.get("tensorrt", True):
        status, needs = tensorrt_status(), "a GPU with TensorRT"
    else:
        status, needs = cuda_status(), "a CUDA GPU (cuda-bindings)"
    if status.available:
        return
    if os.environ.get("TRTOPT_REQUIRE_GPU") == "1":
        pytest.fail(f"TRTOPT_REQUIRE_GPU=1 but the GPU test cannot run: {status.reason}", pytrace=False)
    pytest.skip(f"needs {needs}: {status.reason}")


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands each worker its tests one or two at a time (`--maxschedchunk 1`, unless given). Its `load`
    schedule otherwise starts each worker on a run of consecutive tests, an eighth of the suite: with the slow tests
    first (below) the first worker got every one of them, about two thirds of the suite's CPU time, while the second
    ran the short tests and then idled (xdist 3.8, measured: 432 CPU-s on one worker for 1,621 tests)."""
    if getattr(config.option, "maxschedchunk", "absent") is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked `slow` themselves first (a stable sort: the rest keep their order), the longest of them first
    (`@pytest.mark.slow(seconds=N)`: about N seconds on an idle 2-core machine; unmarked: after those with a figure).
    Handed out one at a time (pytest_configure), the two workers start the long tests (minutes each) together and the
    short ones fill in around them, instead of a long test starting last while the other worker idles. A module marked
    slow as a whole (tests/test_triton_server.py: one server per module and worker) stays in place. Order only: every
    test still runs, and no test reads the figures."""

    def order(item: pytest.Item) -> tuple[bool, float]:
        mark = next((mark for mark in item.own_markers if mark.name == "slow"), None)
        return mark is None, -float(mark.kwargs.get("seconds", 0)) if mark else 0.0

    items.sort(key=order)
