"""Property checks on random graphs (trtopt.zoo.random_graphs), shared by tests/test_graph_fuzz.py and
tools/fuzz_graphs.py. Each check raises AssertionError (or the library's own error) when it fails.

    optimize_preserves_outputs  `optimize` keeps every output within OPTIMIZE_RTOL of the original
    optimize_idempotent         optimising the optimised graph changes nothing (nodes, ops, outputs)
    int8_plan_valid             the CPU INT8 plan passes onnx.checker, loads in ONNX Runtime, produces
                                every graph output with the FP32 model's shape
    qdq_reference_close         the plan's Q/DQ graph run as float math stays within a bound derived from
                                the calibrated thresholds of FP32 (see `qdq_error_bound`)
    kernels_match_reference     ONNX Runtime's INT8 kernels (trtopt.Engine) agree with that reference
    float16_copy_builds         the model converted to float16 (as an FP16 export) builds INT8 with float16
                                inputs and outputs, within property 3's bound of the float16 model
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import onnx
from pass_helpers import max_relative_error

from trtopt.backend.cpu.options import CpuOptions
from trtopt.build import BuildConfig, BuildResult, build_plan
from trtopt.calib import CalibConfig
from trtopt.data import DataConfig
from trtopt.engine import Engine
from trtopt.errors import ModelError
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx
from trtopt.frontend.float_types import lifted_to_float32
from trtopt.passes import OptimizeResult, optimize
from trtopt.passes.check import LOW_RTOL, _relative_error
from trtopt.precision import convert_to_fp16
from trtopt.quant import QuantConfig
from trtopt.zoo.random_graphs import RandomGraph, random_graph

CALIB_SAMPLES = 4
# Property 1 compares outputs relative to their own largest value, as pass_helpers does, but 10x looser
# than its RTOL: random graphs end in saturating activations (Tanh, Sigmoid, Clip) whose outputs are
# ~1 while the tensors feeding them reach 20-30, and the float rounding of those (a few 1e-7 of their
# magnitude, as the passes' own tests measure) then reaches 1e-5 of the output (fuzz seed 41: 1.2e-5).
# A real bug (a dropped bias, a wrong channel) moves outputs by 1e-2 or more.
OPTIMIZE_RTOL = 1e-4
# Property 3 allows FACTOR times the error the thresholds predict (see `qdq_error_bound`), plus a floor
# for outputs that are nearly exact.
QDQ_FACTOR = 4.0
QDQ_FLOOR = 1e-3
# Property 6: a float16 model against the float32 model its copy computes differs by float16's rounding of weights
# and inputs (relative 2^-11 each, a few of them across a graph), well below this.
FLOAT16_SLACK = 1e-2


class DrawChoices:
    """`trtopt.zoo.random_graphs.Choices` from hypothesis's `draw`, so failing graphs shrink."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self.draw = draw

    def integer(self, low: int, high: int) -> int:
        return int(self.draw(st.integers(low, high)))

    def choice(self, options: Any) -> Any:
        return self.draw(st.sampled_from(options))


@st.composite
def random_graphs(draw: Callable[[st.SearchStrategy[Any]], Any], blocks: tuple[str, ...] | None = None) -> RandomGraph:
    return random_graph(DrawChoices(draw), blocks=blocks)


@dataclass(frozen=True)
class BuildVariant:
    """The build options the fuzzer varies; the defaults are `trtopt build --int8`'s, and shrinking goes there.
    `cpu_gemm="on"` exercises the weight encoding of ONNX Runtime's GEMM route (auto: AMX machines only)."""

    method: str = "entropy"
    min_channels: int = 16
    cpu_gemm: str = "auto"
    bias_correction: bool = True

    def config(self, calib: Path) -> BuildConfig:
        return BuildConfig(
            backend="cpu",
            data=DataConfig(sources=(str(calib),)),
            calib=CalibConfig(method=self.method, threads=1),
            quant=QuantConfig(min_channels=self.min_channels, bias_correction=self.bias_correction),
            backend_options=(CpuOptions(gemm=self.cpu_gemm),),
        )


def build_variants() -> st.SearchStrategy[BuildVariant]:
    return st.builds(
        BuildVariant,
        method=st.sampled_from(("entropy", "max", "percentile", "mse")),
        min_channels=st.sampled_from((16, 1, 24)),  # 24: many convs float, some fed by INT8 ones
        cpu_gemm=st.sampled_from(("auto", "on")),
        bias_correction=st.sampled_from((True, False)),
    )


def calibration_samples(model: onnx.ModelProto, count: int = CALIB_SAMPLES) -> np.ndarray:
    """`count` standard-normal inputs (batch 1 each), stacked: what the builds calibrate and run on."""
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(0).standard_normal([count, *shape[1:]]).astype(np.float32)


@dataclass
class Case:
    """One random model and what the checks compute from it, computed once and shared between them."""

    model: onnx.ModelProto
    variant: BuildVariant = BuildVariant()
    samples: np.ndarray = field(init=False)
    _optimized: OptimizeResult | None = None
    _build: BuildResult | None = None

    def __post_init__(self) -> None:
        self.samples = calibration_samples(self.model)

    def feeds(self, index: int) -> dict[str, np.ndarray]:
        return {self.model.graph.input[0].name: self.samples[index : index + 1]}

    @property
    def optimized(self) -> OptimizeResult:
        if self._optimized is None:
            self._optimized = optimize(graph_from_onnx(self.model))
        return self._optimized

    @property
    def build(self) -> BuildResult:
        if self._build is None:
            with tempfile.TemporaryDirectory(prefix="trtopt-fuzz-") as tmp:
                model_path, data_path = Path(tmp, "model.onnx"), Path(tmp, "calib.npy")
                onnx.save(self.model, model_path)
                np.save(data_path, self.samples)
                self._build = build_plan(model_path, self.variant.config(data_path))
        return self._build

    def run_fp32(self) -> list[dict[str, np.ndarray]]:
        return [run_model(self.model, self.feeds(i), opt_level="disable") for i in range(len(self.samples))]

    def run_reference(self) -> list[dict[str, np.ndarray]]:
        """The plan's ONNX with every ONNX Runtime optimisation off: Q/DQ executed as float math."""
        plan_model = onnx.load_from_string(self.build.plan.sections["onnx"])
        return [run_model(plan_model, self.feeds(i), opt_level="disable") for i in range(len(self.samples))]


# -- properties ---------------------------------------------------------------------------------------


def check_optimize_preserves_outputs(case: Case) -> None:
    graph = graph_from_onnx(case.model)
    for i in range(len(case.samples)):
        feeds = case.feeds(i)
        error = max_relative_error(
            run_model(graph, feeds, opt_level="disable"), run_model(case.optimized.graph, feeds, opt_level="disable")
        )
        assert error <= OPTIMIZE_RTOL, f"optimised outputs differ by {error:.2e} of their max (allowed {OPTIMIZE_RTOL})"


def check_optimize_idempotent(case: Case) -> None:
    first = case.optimized.graph
    again = optimize(first)
    changed = [f"{r.name}: {r.summary()}" for r in again.reports if r.changed]
    assert not changed, f"a second optimize still rewrites: {changed}"
    assert Counter(n.op for n in again.graph.nodes) == Counter(n.op for n in first.nodes)
    feeds = case.feeds(0)
    before, after = run_model(first, feeds, opt_level="disable"), run_model(again.graph, feeds, opt_level="disable")
    for name, value in before.items():
        assert np.array_equal(value, after[name]), f"output {name!r} changed on the second optimize"


def check_int8_plan_valid(case: Case) -> None:
    plan_model = onnx.load_from_string(case.build.plan.sections["onnx"])
    onnx.checker.check_model(plan_model)
    expected = {name: value.shape for name, value in case.run_fp32()[0].items()}
    with Engine(case.build.plan, threads=1) as engine:
        produced = engine.infer(case.feeds(0))
    assert {k: v.shape for k, v in produced.items()} == expected, "plan outputs differ from the model's"


def check_qdq_reference_close(case: Case) -> None:
    bound = QDQ_FACTOR * qdq_error_bound(case) + QDQ_FLOOR
    error = _relative_rms_error(case.run_fp32(), case.run_reference())
    assert error <= bound, f"Q/DQ reference is {error:.3g} (relative RMS) from FP32; thresholds allow {bound:.3g}"


def check_kernels_match_reference(case: Case) -> None:
    """ONNX Runtime's INT8 kernels vs the same Q/DQ graph as float math. They differ only where a
    requantisation rounds the other way (at most one step of a tensor's grid), so the rounding part of
    `qdq_error_bound` bounds it too. The plan runs as `Engine` runs it, so on CPUs whose u8s8 kernels saturate
    (AVX2 without VNNI) it is in the u8u8 encoding the build chose and verified there."""
    bound = QDQ_FACTOR * qdq_error_bound(case, clipping=False) + QDQ_FLOOR
    with Engine(case.build.plan, threads=1) as engine:
        kernels = [engine.infer(case.feeds(i)) for i in range(len(case.samples))]
    error = _relative_rms_error(case.run_reference(), kernels)
    assert error <= bound, f"INT8 kernels are {error:.3g} (relative RMS) from the Q/DQ reference; allowed {bound:.3g}"


def check_float16_copy_builds(case: Case) -> None:
    """The model as an FP16 export gives it (float16 inputs, outputs and weights: trtopt.precision.convert_to_fp16)
    builds INT8 on its float32 copy (trtopt.frontend.float_types). The plan takes and gives float16, and its kernels
    stay as close to the float16 model as property 3 allows the float32 model's plan, plus float16's rounding."""
    half = convert_to_fp16(case.model, keep_io_fp32=False)
    samples = case.samples.astype(np.float16)
    with tempfile.TemporaryDirectory(prefix="trtopt-fuzz-") as tmp:
        model_path, data_path = Path(tmp, "half.onnx"), Path(tmp, "calib.npy")
        onnx.save(half, model_path)
        np.save(data_path, samples)
        try:
            plan = build_plan(model_path, case.variant.config(data_path)).plan
        except ModelError as exc:  # right where float16 itself moves the outputs (a deep tanh chain: 5-6%)
            own = _float16_rounding(half, samples)
            assert "float32 copy of this float16 model" in str(exc) and own > LOW_RTOL / 2, (
                f"refused, though the float16 model is {own:.3g} from its float32 copy: {exc}")
            return
    assert {s.dtype for s in (*plan.inputs, *plan.outputs)} == {"float16"}, "the plan changed the model's types"
    feeds = [{half.graph.input[0].name: samples[i : i + 1]} for i in range(len(samples))]
    with Engine(plan, threads=1) as engine:
        kernels = [engine.infer(f) for f in feeds]
    error = _relative_rms_error([run_model(half, f, opt_level="disable") for f in feeds], kernels)
    bound = QDQ_FACTOR * qdq_error_bound(case) + QDQ_FLOOR + FLOAT16_SLACK
    assert error <= bound, f"the float16 copy's plan is {error:.3g} (relative RMS) from it; allowed {bound:.3g}"


def _float16_rounding(half: onnx.ModelProto, samples: np.ndarray) -> float:
    """How far the float16 model is from its float32 copy on `samples` (the largest difference over the largest
    value, per output, as the build's check measures it: trtopt.passes.check)."""
    copy, name = lifted_to_float32(half), half.graph.input[0].name
    worst = 0.0
    for i in range(len(samples)):
        want = run_model(half, {name: samples[i : i + 1]}, opt_level="disable")
        have = run_model(copy, {name: samples[i : i + 1]}, opt_level="disable")
        worst = max(worst, *(_relative_error(value, have[key]) for key, value in want.items()))
    return worst


PROPERTIES: dict[str, Callable[[Case], None]] = {
    "optimize_preserves_outputs": check_optimize_preserves_outputs,
    "optimize_idempotent": check_optimize_idempotent,
    "int8_plan_valid": check_int8_plan_valid,
    "qdq_reference_close": check_qdq_reference_close,
    "kernels_match_reference": check_kernels_match_reference,
    "float16_copy_builds": check_float16_copy_builds,
}


# -- the bound of property 3 ----------------------------------------------------------------------------


def qdq_error_bound(case: Case, *, clipping: bool = True) -> float:
    """The relative RMS error the plan's quantisation predicts at the outputs, from its thresholds.

    Each quantised activation x with threshold T adds an error of RMS sqrt(s^2/12 + E[(|x| - T)+^2]):
    rounding to a grid of step s = T/127 (uniform error on [-s/2, s/2]; the CPU encoding of non-negative
    tensors has step T/255, smaller) plus the clipping of what lies beyond T (measured on the samples).
    Each INT8 weight adds s_c/sqrt(12) per channel. Divided by the RMS of the quantised tensor itself,
    that is a noise-to-signal ratio per site; independent errors add in quadrature, and the layers of
    these graphs (He init, BatchNorm, activations with gain <= 1) carry a relative error forward without
    amplifying it much. So the output's relative RMS error should be about sqrt(sum ratio^2) over all
    sites; summing every site (not only those upstream of an output) overestimates it. QDQ_FACTOR allows
    for residual Adds whose branches partly cancel and for correlated rounding. A misplaced scale, a
    wrong axis or a dropped bias gives errors of order 1, far beyond the bound.
    """
    thresholds = case.build.qdq.thresholds if case.build.qdq is not None else {}
    exposed = [t for t in thresholds if t in case.optimized.graph.tensors()]
    ratios = []
    values = [
        run_model(case.optimized.graph, case.feeds(i), expose=exposed, opt_level="disable")
        for i in range(len(case.samples))
    ]
    for name in exposed:
        x = np.concatenate([v[name].ravel() for v in values]).astype(np.float64)
        power = float(np.mean(x**2))
        threshold = float(thresholds[name])
        beyond = float(np.mean(np.maximum(np.abs(x) - threshold, 0.0) ** 2)) if clipping else 0.0
        if power > 0:
            ratios.append(((threshold / 127) ** 2 / 12 + beyond) / power)
    ratios += _weight_ratios(onnx.load_from_string(case.build.plan.sections["onnx"]))
    return math.sqrt(sum(ratios))


def _weight_ratios(model: onnx.ModelProto) -> list[float]:
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    ratios = []
    for node in model.graph.node:
        q = inits.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if q is None or q.dtype != np.int8 or q.ndim < 2:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % q.ndim
        shape = [1] * q.ndim
        shape[axis] = -1
        scale = inits[node.input[1]].astype(np.float64).reshape(shape)
        weights = q.astype(np.float64) * scale
        power = float(np.mean(weights**2))
        if power > 0:
            ratios.append(float(np.mean(np.broadcast_to(scale, q.shape) ** 2)) / 12 / power)
    return ratios


def _relative_rms_error(expected: list[dict[str, np.ndarray]], actual: list[dict[str, np.ndarray]]) -> float:
    """max over outputs of ||actual - expected|| / ||expected||, all samples together."""
    worst = 0.0
    for name in expected[0]:
        ref = np.concatenate([e[name].ravel() for e in expected]).astype(np.float64)
        got = np.concatenate([a[name].ravel() for a in actual]).astype(np.float64)
        worst = max(worst, float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-12)))
    return worst
