"""A 2:4-pruned model through `trtopt build --int8 --sparsity`: Q/DQ insertion, per-channel INT8 weights, bias
correction and the CPU lowering keep every pruned zero exactly (read from the stored INT8 weights of the built
plan's ONNX), the build records and prints the layers that qualify, and TensorRT's sparsity log lines reach
the user (against NVIDIA's real Python bindings).

The model (tests/sparsity_helpers.py): five eligible layers, two that are not; built with --min-channels 1 so
that every layer is quantised.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from sparsity_helpers import ELIGIBLE, NOT_ELIGIBLE, mixed_model, weights_of

from trtopt.backend import get_backend
from trtopt.backend.cpu import builder as cpu_builder
from trtopt.backend.cpu import lowering
from trtopt.build import BuildConfig, build_plan
from trtopt.cli.main import main
from trtopt.plan import read_plan
from trtopt.quant import QuantConfig
from trtopt.sparsify import sparsify


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sparse-build")
    onnx.save_model(sparsify(mixed_model(seed=5)).model, root / "sparse.onnx")
    (root / "data").mkdir()
    rng = np.random.default_rng(0)
    for i in range(16):
        np.save(root / "data" / f"{i}.npy", rng.standard_normal((8, 10, 10)).astype(np.float32))
    return root


@pytest.fixture(scope="module")
def built(workdir: Path) -> tuple[dict, onnx.ModelProto]:  # type: ignore[type-arg]
    """`trtopt build --int8 --sparsity --json` once: (its summary, the Q/DQ model handed to the CPU lowering)."""
    import contextlib
    import io
    import json

    seen: list[onnx.ModelProto] = []
    original = lowering.lower_for_cpu
    args = ["build", str(workdir / "sparse.onnx"), "--int8", "--calib", str(workdir / "data"), "--backend", "cpu",
            "--min-channels", "1", "--sparsity", "--json", "-o", str(workdir / "sparse.engine")]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as stdout:
        patch.setattr(cpu_builder, "lower_for_cpu", lambda model, **kw: seen.append(model) or original(model, **kw))
        assert main(args) == 0
    return json.loads(stdout.getvalue()), seen[0]


def config(workdir: Path, **fields: object) -> BuildConfig:
    from trtopt.data.config import DataConfig

    data = DataConfig(sources=(str(workdir / "data"),))
    return BuildConfig(backend="cpu", data=data, quant=QuantConfig(min_channels=1), **fields)  # type: ignore[arg-type]


def stored_int8_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """{layer: stored integer weight minus its zero point}, read from the DequantizeLinear that feeds the
    layer's weight input: the value the plan means, in any CPU encoding (int8 q, uint8 q + 128, q - 1)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    result = {}
    for node in model.graph.node:
        dq = producers.get(node.input[1]) if node.op_type in ("Conv", "Gemm", "MatMul") else None
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
            q = inits[dq.input[0]].astype(np.int64)
            zero = inits[dq.input[2]].astype(np.int64)
            axis = next((a.i for a in dq.attribute if a.name == "axis"), 1) % q.ndim
            shape = [1] * q.ndim
            shape[axis] = -1
            result[node.name] = q - (zero.reshape(shape) if zero.ndim else zero)
    return result


def assert_zeros_kept(model: onnx.ModelProto, sparse: dict[str, np.ndarray]) -> None:
    stored = stored_int8_weights(model)
    assert set(stored) == set(ELIGIBLE) | set(NOT_ELIGIBLE), "every layer is quantised"
    for layer in ELIGIBLE:
        pruned = sparse[layer] == 0
        assert pruned.mean() >= 0.5 and (stored[layer][pruned] == 0).all(), layer
        groups = np.moveaxis(stored[layer] == 0, ELIGIBLE[layer], -1).reshape(-1, 4)
        assert (groups.sum(axis=1) >= 2).all(), f"{layer} is no longer 2:4 as stored"


def test_int8_build_keeps_every_pruned_zero_in_the_stored_weights(workdir: Path, built) -> None:  # type: ignore[no-untyped-def]
    summary, _ = built
    plan = read_plan(workdir / "sparse.engine")
    assert summary["bias_corrected_layers"] >= len(ELIGIBLE) - 1  # the MatMul has no bias; the others moved
    assert_zeros_kept(onnx.load_from_string(plan.sections["onnx"]), weights_of(onnx.load(workdir / "sparse.onnx")))
    record = plan.metadata["sparsity"]
    assert record == summary["sparsity"] and set(record["qualifying_layers"]) == set(ELIGIBLE)
    assert record["backend"] == "cpu" and not record["eligible_not_2_4"] and not record["fp32_layers_with_2_4_weights"]
    assert 0 < record["qualifying_mac_share"] < 1
    assert record["qualifying_mac_share"] == pytest.approx(record["eligible_mac_share"])


@pytest.mark.parametrize(("encoding", "gemm_min_k"), [("u8s8", None), ("u8s8", 1), ("u8u8", None)])
def test_every_cpu_encoding_keeps_the_zeros(workdir: Path, built, encoding: str, gemm_min_k: int | None) -> None:  # type: ignore[no-untyped-def]
    """The lowering's weight encodings (int8 q; q - 1 with zero point -1 for GEMM-routed convs; uint8 q + 128)
    applied to the build's own Q/DQ model (bias-corrected), whichever one this CPU would pick."""
    _, qdq = built
    assert_zeros_kept(qdq, weights_of(onnx.load(workdir / "sparse.onnx")))
    lowered = lowering.lower_for_cpu(qdq, gemm_min_k=gemm_min_k, encoding=encoding)
    assert_zeros_kept(lowered, weights_of(onnx.load(workdir / "sparse.onnx")))
    names = ("int8/zero_point", "int8p/zero_point")  # 8-bit weights, pair-bounded where the CPU's u8s8 saturates
    zero_points = [numpy_helper.to_array(t) for t in lowered.graph.initializer if t.name.endswith(names)]
    assert any((z == -1).all() for z in zero_points) == (gemm_min_k is not None)


def test_dense_eligible_layers_and_fp32_layers_are_told_apart(workdir: Path) -> None:
    dense = workdir / "dense.onnx"
    onnx.save_model(sparsify(mixed_model(seed=5), layers=["conv_3"]).model, dense)
    int8 = build_plan(dense, config(workdir, sparsity=True)).plan.metadata["sparsity"]
    assert int8["qualifying_layers"] == ["conv_3"] and set(int8["eligible_not_2_4"]) == set(ELIGIBLE) - {"conv_3"}
    fp32 = build_plan(dense, BuildConfig(backend="cpu", int8=False)).plan.metadata
    assert "sparsity" not in fp32  # recorded only when asked for
    fp32 = build_plan(dense, BuildConfig(backend="cpu", int8=False, sparsity=True)).plan.metadata["sparsity"]
    assert fp32["qualifying_layers"] == [] and fp32["fp32_layers_with_2_4_weights"] == ["conv_3"]


def test_build_summary_lists_the_layers_and_says_what_it_cannot_know(built, capsys) -> None:  # type: ignore[no-untyped-def]
    from trtopt.cli.summaries import print_build_summary

    summary, _ = built
    print_build_summary(summary, "cpu")
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the words of each table cell
    assert "5 layers qualify" in text and "conv_1" in text and "no 2:4 sparse path" in text
    note = get_backend("tensorrt").sparsity_note
    print_build_summary({**summary, "sparsity": {**summary["sparsity"], "backend": "tensorrt", "note": note}},
                        "tensorrt")  # fmt: skip
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "trtopt cannot see that choice" in text and "no trtopt build has yet run on a GPU" in text


PICKED = "(Sparsity) TRT inference plan picked sparse implementation for layers: conv_3"  # the guide's example


def test_tensorrt_sparsity_log_lines_are_shown_with_verbose(caplog) -> None:  # type: ignore[no-untyped-def]
    """Through the real bindings' ILogger: '(Sparsity) ...' at INFO (shown with -v), other INFO at DEBUG."""
    from trt_native_double import real_tensorrt

    from trtopt.backend.tensorrt import builder

    trt = real_tensorrt()
    logger = builder._make_logger(trt)
    with caplog.at_level(logging.DEBUG, logger="trtopt.backend.tensorrt.builder"):
        logger.log(trt.ILogger.INFO, PICKED)
        logger.log(trt.ILogger.INFO, "Total Activation Memory: 1234")
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert levels[f"TensorRT: {PICKED}"] == logging.INFO
    assert levels["TensorRT: Total Activation Memory: 1234"] == logging.DEBUG
