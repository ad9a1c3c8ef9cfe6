"""The small models the onnx wheel ships with their inputs and the outputs they must give
(onnx/backend/test/data: pytorch-converted, pytorch-operator, simple; 140 models at opsets 6 to 13, written by
onnx's and PyTorch's authors, not for trtopt), built as a user would: `trtopt build model.onnx --verify-data
inputs.npz`, and INT8 where the model has a Conv, ConvTranspose, Gemm or MatMul. The plan must give the stored
outputs, or the build must refuse with an error that says why.

Nobody tuned trtopt to these. Run first, they found eight bugs (docs/holdout.md, round 6), each now also
pinned by a test below: opset-6 PReLU slopes broadcast against the wrong axis after onnx's version converter,
sequence-typed values turned into tensors by onnx-graphsurgeon's `Graph.copy` (ONNX Runtime then refused the
graph), a 0-d output crashing the verification, Sqrt/Pow outputs that are NaN on some inputs failing it,
integer size inputs that refuse random inputs with no way to give real ones, and an FP32 build of a grey
model refused for want of a grey mean and std it does not need.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import trtopt
from trtopt.cli.main import main
from trtopt.errors import ShapeError
from trtopt.plan import read_plan

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
CASES = sorted(p for kind in ("pytorch-converted", "pytorch-operator", "simple") for p in (DATA / kind).iterdir()
               if (p / "model.onnx").is_file())  # fmt: skip
# Refused, and rightly: the op is onnx's training preview (a gradient of the graph), which no runtime trtopt
# targets executes.
REFUSED = dict.fromkeys(("test_gradient_of_add", "test_gradient_of_add_and_mul"), "ai.onnx.preview.training")
# String inputs cannot come from .npz (trtopt loads no pickles); StringNormalizer also needs the en_US.UTF-8
# locale in ONNX Runtime, which a machine may lack. `test_string_models_build_or_refuse_cleanly` covers them.
STRINGS = {p.name for p in CASES if p.name.startswith("test_strnorm")}
QUANTISABLE = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
FP32_TOLERANCE = 1e-5  # largest difference over the largest stored value: float32 rounding, op for op
INT8_TOLERANCE = 0.05


def stored(case: Path) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """(feeds by input name, expected outputs in order) of the case's test_data_set_0."""
    model = onnx.load(str(case / "model.onnx"), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in weights]

    def read(kind: str) -> list[np.ndarray]:
        files = sorted((case / "test_data_set_0").glob(f"{kind}_*.pb"), key=lambda f: int(f.stem.split("_")[1]))
        return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]

    return dict(zip(names, read("input"), strict=True)), read("output")


def largest_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference over the largest finite expected value; the same NaN or inf in both agrees."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    same = (np.isnan(got) & np.isnan(want)) | (got == want)
    finite = np.isfinite(want)
    scale = float(np.max(np.abs(want[finite]))) if finite.any() else 1.0
    return float(np.max(np.where(same, 0.0, np.abs(got - want)), initial=0.0)) / max(scale, 1e-12)


def assert_outputs(plan: Path, feeds: dict[str, np.ndarray], expected: list[np.ndarray], tolerance: float) -> None:
    engine = trtopt.Engine.load(plan)
    outputs = list(engine.infer(feeds).values())
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        assert got.shape == want.shape
        assert largest_error(got, want) <= tolerance


@pytest.mark.parametrize("case", [c for c in CASES if c.name not in STRINGS], ids=lambda c: f"{c.parent.name}/{c.name}")
def test_the_fp32_plan_gives_the_stored_outputs(case: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    feeds, expected = stored(case)
    np.savez(tmp_path / "inputs.npz", **feeds)
    plan = tmp_path / "plan.engine"
    code = main(["build", str(case / "model.onnx"), "-o", str(plan), "--verify-data", str(tmp_path / "inputs.npz")])
    err = capsys.readouterr().err
    if case.name in REFUSED:
        assert code == 2 and REFUSED[case.name] in err and "Traceback" not in err
        assert not plan.exists()
        return
    assert code == 0, err
    if not all(v.size for v in feeds.values()):  # test_sequence_model8 splits an empty tensor
        with pytest.raises(ShapeError, match="is empty"):
            trtopt.Engine.load(plan).infer(feeds)
        return
    assert_outputs(plan, feeds, expected, FP32_TOLERANCE)


def quantisable(case: Path) -> bool:
    return any(n.op_type in QUANTISABLE for n in onnx.load(str(case / "model.onnx")).graph.node)


@pytest.mark.parametrize("case", [c for c in CASES if quantisable(c)], ids=lambda c: f"{c.parent.name}/{c.name}")
def test_the_int8_plan_is_verified_and_near_the_stored_outputs(case: Path, tmp_path: Path) -> None:
    """Calibrated on the stored input and 7 noisy copies of it (stacked on the batch axis, or as whole feeds where
    the inputs share none), verified on the stored input."""
    feeds, expected = stored(case)
    rng = np.random.default_rng(0)
    noisy = [{k: v + rng.normal(0, 0.1 * float(np.std(v)), v.shape).astype(v.dtype) for k, v in feeds.items()}
             for _ in range(7)]  # fmt: skip
    copies = [feeds, *noisy]
    plan, verify = tmp_path / "plan.engine", tmp_path / "inputs.npz"
    np.savez(verify, **feeds)
    for join in (np.concatenate, np.stack):
        np.savez(tmp_path / "calib.npz", **{k: join([c[k] for c in copies]) for k in feeds})
        code = main(["build", str(case / "model.onnx"), "--int8", "--calib", str(tmp_path / "calib.npz"),
                     "--verify-data", str(verify), "-o", str(plan)])  # fmt: skip
        if code == 0:
            break
    assert code == 0
    assert read_plan(plan).metadata["verification"]["samples"] >= 1
    assert_outputs(plan, feeds, expected, INT8_TOLERANCE)


def test_string_models_build_or_refuse_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A build of each StringNormalizer model without data either writes a plan or says why (ONNX Runtime's
    locale), never a traceback."""
    for name in sorted(STRINGS):
        case = next(c for c in CASES if c.name == name)
        code = main(["build", str(case / "model.onnx"), "-o", str(tmp_path / f"{name}.engine")])
        err = capsys.readouterr().err
        assert code in (0, 2) and "Traceback" not in err, err
        assert code == 0 or "locale" in err


def test_an_integer_size_input_asks_for_verify_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Expand's `shape` input: the random inputs of a build without data give it zeros, which ONNX Runtime
    refuses; the error names the input and the flag, and nothing is written."""
    case = DATA / "simple" / "test_expand_shape_model1"
    assert main(["build", str(case / "model.onnx"), "-o", str(tmp_path / "plan.engine")]) == 2
    err = capsys.readouterr().err
    assert "integer inputs ['shape'] were zeros" in err and "--verify-data" in err
    assert not (tmp_path / "plan.engine").exists()


def test_the_opset_6_prelu_slope_is_per_channel() -> None:
    """PReLU(num_parameters=3) on [2, 3, 4, 5] at opset 6: onnx's converter alone leaves a [3] slope that
    broadcasts against the last axis (ONNX Runtime refuses it; with as many columns as channels it would
    compute something else). The converted model itself gives the stored output."""
    from trtopt.execution.ort_session import run_model
    from trtopt.frontend.opset import model_at_opset

    case = DATA / "pytorch-converted" / "test_PReLU_2d_multiparam"
    feeds, expected = stored(case)
    converted = model_at_opset(onnx.load(str(case / "model.onnx")), 6, "test")
    outputs = run_model(converted, feeds)
    assert largest_error(next(iter(outputs.values())), expected[0]) <= FP32_TOLERANCE


def test_a_grey_fp32_build_stores_no_recipe(tmp_path: Path) -> None:
    case = DATA / "pytorch-operator" / "test_operator_pad"  # input [1, 1, 2, 4]
    assert main(["build", str(case / "model.onnx"), "-o", str(tmp_path / "plan.engine")]) == 0
    assert read_plan(tmp_path / "plan.engine").preprocess is None
