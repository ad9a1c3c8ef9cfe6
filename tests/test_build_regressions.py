"""INT8 builds of graphs that once broke: issue #13 failure 2, and the fuzzer's reproductions
(tests/data/fuzz/, written by tools/fuzz_graphs.py), each built and checked with tests/graph_fuzz.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from graph_fuzz import Case, check_int8_plan_valid, check_qdq_reference_close
from quant_helpers import cosine

from trtopt.engine import Engine
from trtopt.execution import run_model
from trtopt.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]


def test_inception_with_pooling_branch_keeps_every_node_in_int8() -> None:
    """Issue #13, failure 2: the 3x3 branch conv's output pair and the Concat's input pair landed on the
    same edge under the same names, closing a cycle; the CPU lowering then dropped every node after the
    Concat and ONNX Runtime refused the plan ("Graph output (logits) does not exist")."""
    model = build_model("inception_pool_net")
    case = Case(model)
    check_int8_plan_valid(case)
    check_qdq_reference_close(case)
    plan_model = onnx.load_from_string(case.build.plan.sections["onnx"])
    ops = {n.op_type for n in plan_model.graph.node}
    assert {"Concat", "Gemm", "Add", "MaxPool"} <= ops
    x = np.random.default_rng(5).standard_normal((6, 3, 16, 16)).astype(np.float32)
    with Engine(case.build.plan, threads=1) as engine:
        int8 = np.concatenate([engine.infer({"input": x[i : i + 1]})["logits"] for i in range(len(x))])
    fp32 = np.concatenate([run_model(model, {"input": x[i : i + 1]})["logits"] for i in range(len(x))])
    assert cosine(fp32, int8) > 0.999  # measured 0.999997; a lost or misrouted branch gives < 0.9
    assert (fp32.argmax(1) == int8.argmax(1)).all()


@pytest.mark.slow
def test_light_models_nobody_tuned_for_build_and_verify_in_int8(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Models from the onnx package (opset 9, random weights) that trtopt was never tuned on. SqueezeNet and
    Inception-v1 once failed with a cycle in the quantised graph (a fire/inception module's conv feeding a
    Concat); now every INT8 build verifies itself: kernels within tolerance of the Q/DQ reference."""
    from trtopt.build import BuildConfig, build_plan
    from trtopt.data import DataConfig
    from trtopt.zoo.light import light_model

    images = sorted((ROOT / "calib_data").glob("*.jpg"))[:12]
    for name in ("squeezenet", "inception_v1"):
        onnx.save(light_model(name, seed=1, opset=9), tmp_path / f"{name}.onnx")
        config = BuildConfig(backend="cpu", data=DataConfig(sources=tuple(str(p) for p in images)))
        result = build_plan(tmp_path / f"{name}.onnx", config)
        v = result.verification
        assert v is not None and v.ok, (name, v)
        assert v.reference_vs_fp32.cosine > 0.99, (name, v.reference_vs_fp32)
        assert result.report.int8_convs >= 20, (name, result.report)
