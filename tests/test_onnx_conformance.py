"""ONNX's own conformance cases (1,884 one-op models that onnx generates in memory with their expected outputs,
opsets 1-27), built FP32 as `trtopt build --verify-data` would (tools/onnx_conformance.py): here every op's first
case and every second after it, about 1,000 (all 280 op sets; the tool alone sweeps all). Where ONNX Runtime
itself gives the expected outputs, trtopt must too, or refuse with an error that is not its own bug: no traceback,
no plan with other outputs, no graph check that catches trtopt.

The first run found four kinds of bug (docs/holdout.md, round 6): onnx-graphsurgeon folding `Shape(start, end)`
as the whole shape, a flattened `If` whose branch reads its own output, zero-size outputs crashing the
verification, and they are each pinned by a smaller test as well."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow(seconds=70)  # about 1,000 builds on two processes of its own
def test_conformance_cases_build_right_or_refuse_cleanly(tmp_path: Path) -> None:
    """Every op's first case and every second after it (`--every 2`: the suite's time; the tool alone runs all)."""
    out = tmp_path / "results.jsonl"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "onnx_conformance.py"), "--out", str(out),
                           "--every", "2"], capture_output=True, text=True, timeout=900)  # fmt: skip
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) > 900, done.stdout + done.stderr
    broken = [r for r in records if r["result"] in ("bug", "wrong")]
    assert not broken, broken[:3]
    own = [r for r in records if r["result"] == "refused" and "trtopt bug" in r["why"]]
    assert not own, own[:3]
    judged = [r for r in records if r["result"] in ("ok", "refused")]
    assert sum(r["result"] == "ok" for r in judged) >= 0.7 * len(judged)
    assert done.returncode == 0, done.stdout[-2000:]


def test_int8_build_of_a_vector_dot_product(tmp_path: Path) -> None:
    """MatMul of two 1-D inputs gives a 0-d output; the sensitivity search's per-sample cosines sliced it by
    rows and raised IndexError (a traceback on `test_matmul_1d_1d`). The case's model, written here as onnx writes
    it (opset 13, two float vectors of 3): collecting onnx's cases computes every op's expected outputs, 12 s of CPU
    even for one op type."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from trtopt.cli.main import main

    vectors = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [3]) for name in ("a", "b")]
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "test_matmul_1d_1d", vectors,
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [])])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "model.onnx")
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(3).astype(np.float32) for name in ("a", "b")}
    np.savez(tmp_path / "calib.npz", **{n: np.concatenate([a + rng.normal(0, 0.1, a.shape).astype(a.dtype)
                                                           for _ in range(8)]) for n, a in feeds.items()})  # fmt: skip
    np.savez(tmp_path / "inputs.npz", **feeds)  # checked on the two vectors: one dot product, one 0-d output
    code = main(["build", str(tmp_path / "model.onnx"), "--int8", "--calib", str(tmp_path / "calib.npz"),
                 "--verify-data", str(tmp_path / "inputs.npz"), "-o", str(tmp_path / "plan.engine")])  # fmt: skip
    assert code == 0


@pytest.mark.slow
def test_int8_builds_of_the_float16_cases(tmp_path: Path) -> None:
    """onnx's float16 Attention, CausalConv and FlexAttention cases: INT8 builds calibrated their float32 copy
    and verified (trtopt.frontend.float_types). They used to fail with "The built plan is not valid: Type Error ...
    QuantizeLinear" and blame trtopt's passes, then were refused. In a subprocess: onnx collects its cases once
    per process, for the op type the first call names."""
    out = tmp_path / "results.jsonl"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "onnx_conformance.py"), "--int8", "--only", "fp16",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)  # fmt: skip
    records = [json.loads(line) for line in out.read_text().splitlines()]
    built = [r for r in records if r["result"] == "ok"]
    assert len(built) >= 5, done.stdout + done.stderr[-2000:]  # others: no quantised layer, or ORT differs
    assert all(r["cosine"] > 0.999 for r in built), built
    assert done.returncode == 0, done.stdout[-2000:]
