"""Shared test setup: the `gpu` marker skips with the reason where there is no GPU/TensorRT, and fails
with that reason when TRTOPT_REQUIRE_GPU=1 (so a GPU CI cannot pass by skipping)."""

from __future__ import annotations

import os

import pytest


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    from trtopt.backend.tensorrt.detect import tensorrt_status

    status = tensorrt_status()
    if status.available:
        return
    if os.environ.get("TRTOPT_REQUIRE_GPU") == "1":
        pytest.fail(f"TRTOPT_REQUIRE_GPU=1 but the GPU test cannot run: {status.reason}", pytrace=False)
    pytest.skip(f"needs a GPU with TensorRT: {status.reason}")
