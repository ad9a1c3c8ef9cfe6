"""Shared test setup: the `gpu` marker skips with the reason where there is no GPU/TensorRT, and fails
with that reason when TRTOPT_REQUIRE_GPU=1 (so a GPU CI cannot pass by skipping).

``@pytest.mark.gpu`` needs TensorRT and a GPU; ``@pytest.mark.gpu(tensorrt=False)`` needs only CUDA
(cuda-bindings and a GPU): the runtime's CUDA layer is checked there without TensorRT.

TRTOPT_REQUIRE_OPTIONAL=1 fails the tests skipped for a missing optional dependency (require_optional.py).
The `light_graph` fixture loads each light model (trtopt.zoo.light) once per session."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from require_optional import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (hooks)

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs


@pytest.fixture(scope="session")
def light_graph() -> Callable[[str], gs.Graph]:
    """light:NAME as a gs.Graph (`graph_from_onnx(light_model(NAME))`), converted once per session; the
    graph is shared, so copy it (as `optimize` does) before changing it."""
    from trtopt.frontend import graph_from_onnx
    from trtopt.zoo.light import light_model

    return functools.cache(lambda name: graph_from_onnx(light_model(name)))


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
