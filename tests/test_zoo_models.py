"""Every cached real model of the zoo (tools/zoo.py) loads, keeps its outputs through the optimiser (ONNX
Runtime, float tolerance), and builds an INT8 plan on the CPU backend whose verification passes.

Kept cheap: one real input for the optimiser check; 4 calibration samples and 4 verification samples for
the build, and the text detector at 320x320 instead of the catalog's 640x640. Models that are not cached
skip with the reason (CI fills the cache first: `python tools/zoo.py fetch` in .ci/run).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from zoo_fixtures import ZooCase, zoo_case, zoo_model  # noqa: F401  (the fixture)

from trtopt.cli.main import main
from trtopt.cli.preprocess_args import add_preprocess_arguments, preprocess_config
from trtopt.data import input_infos_from_graph, load_dataset
from trtopt.data.samples import preprocess_spec_for
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, load_model, onnx_from_graph
from trtopt.passes import optimize

# Smaller static shapes than the catalog's, where the model allows them (dynamic H/W), to keep the suite fast.
TEST_SHAPES = {"ppocr-v4-det": "x:1x3x320x320"}
def shapes_flag(case: ZooCase) -> list[str]:
    if case.model.name in TEST_SHAPES:
        return ["--shapes", TEST_SHAPES[case.model.name]]
    return list(case.model.shapes_flag)


def one_feed(case: ZooCase, graph) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """The first calibration sample, preprocessed by the catalog's flags as the CLI would."""
    parser = argparse.ArgumentParser()
    add_preprocess_arguments(parser)
    args = parser.parse_args(list(case.model.preprocess))
    spec = preprocess_spec_for(case.path, graph, preprocess_config(args))
    data = load_dataset(case.calib, input_infos_from_graph(graph), spec, count=1)
    (batch,) = list(data.batches(1))
    return batch.feeds


def test_loads_and_optimizes_within_float_tolerance(zoo_model: ZooCase) -> None:  # noqa: F811
    shapes = None
    flag = shapes_flag(zoo_model)
    if flag:
        name, dims = flag[1].split(":")
        shapes = {name: tuple(int(d) for d in dims.split("x"))}
    model = load_model(zoo_model.path).model
    graph = graph_from_onnx(model, shapes=shapes)
    feeds = one_feed(zoo_model, graph)
    before = run_model(onnx_from_graph(graph), feeds)
    report = optimize(graph)
    after = run_model(onnx_from_graph(report.graph), feeds)
    assert set(after) == set(before)
    for name, value in before.items():
        scale = max(1e-6, float(np.abs(value).max()))
        np.testing.assert_allclose(after[name], value, rtol=1e-3, atol=1e-4 * scale, err_msg=name)


@pytest.mark.slow
def test_builds_int8_on_cpu_with_verification(zoo_model: ZooCase, tmp_path: Path,  # noqa: F811
                                              capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / f"{zoo_model.model.name}.engine"
    argv = ["build", str(zoo_model.path), "--int8", "--calib", str(zoo_model.calib), "--calib-count", "4",
            "--verify-samples", "4", "--calib-batch", "4", "--backend", "cpu", "-o", str(plan), "--json",
            "--no-auto-exclude",  # its trial builds cost minutes per model; tests/test_quant_sensitivity.py covers it
            *zoo_model.model.preprocess, *shapes_flag(zoo_model)]
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    verification = summary["verification"]
    assert plan.is_file() and summary["backend"] == "cpu"
    assert verification["samples"] == 4
    assert verification["kernels_vs_reference"]["rel_error"] <= verification["tolerance"]
    assert summary["int8_layers"] > 0


@pytest.mark.slow
def test_a_plan_calibrated_on_the_wrong_data_is_called_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #13: PP-OCRv4-det calibrated on photos (not pages) with entropy and no sensitivity search has an
    INT8 reference far from FP32. Whether its kernels then stay under the tolerance cap (plan written, flagged)
    or not (refused), the build says the plan's own math is far from FP32 and what to change. u8u8 weights: the
    same plan on every CPU."""
    case = zoo_case("ppocr-v4-det")
    plan = tmp_path / "det.engine"
    argv = ["build", str(case.path), "--int8", "--calib", "calib_data", "--calib-count", "16", "--verify-samples", "4",
            "--calib-batch", "4", "--method", "entropy", "--no-auto-exclude", "--backend", "cpu", "-o", str(plan),
            "--cpu-encoding", "u8u8", "--json", *case.model.preprocess, *shapes_flag(case)]  # fmt: skip
    code = main(argv)
    captured = capsys.readouterr()
    if code == 0:
        summary = json.loads(captured.out)
        assert summary["verification"]["far_from_fp32"] and "far from FP32" in summary["warnings"][0]
    else:
        assert code == 2 and "far from FP32 too" in captured.err and "--calib" in captured.err and not plan.exists()
