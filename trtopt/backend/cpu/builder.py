"""CPU build: lower the Q/DQ graph for ONNX Runtime and check that its INT8 kernels took it."""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import onnx
import onnxruntime as ort

from trtopt.backend.cpu.isa import EXACT_U8S8, SATURATING_U8S8, cpu_isa
from trtopt.backend.cpu.lowering import ENCODINGS, lower_for_cpu
from trtopt.backend.cpu.movement import move_quantisation
from trtopt.backend.cpu.options import GEMM_CHOICES, CpuOptions
from trtopt.errors import TrtoptError, UnknownNameError
from trtopt.execution.ort_session import session_options

INT8_CONV_OPS = {"QLinearConv", "ConvInteger"}
INT8_MATMUL_OPS = {"QLinearMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm"}
FLOAT_CONV_OPS = {"Conv", "FusedConv", "NchwcConv"}
# ONNX Runtime's WeightBiasQuantization transformer quantises the float weights of a Conv/Gemm/MatMul
# whose input comes from a DequantizeLinear and whose output goes to a QuantizeLinear. trtopt quantises
# every weight it means to itself, so that transformer only ever overrides a user's `--exclude` (an
# excluded layer between two INT8 layers); it is switched off for every CPU session.
# QDQPropagationTransformer moves a QuantizeLinear up across MaxPool, Reshape, Transpose and the like. trtopt
# already puts each pair where its INT8 layer reads it, so the move only ever undoes a placement: where a float
# layer (a stem conv with 3 input channels) feeds Relu -> MaxPool -> Q, the Q lands before the MaxPool, the Relu
# before it is dropped, Conv + Relu no longer fuse, and the MaxPool runs on uint8 in ONNX Runtime's slow NCHW
# integer pooling (5.3 ms of 12.5 on squeezenet1_1, against 0.6 ms for all of FP32's pools). Measured with it
# off on 11 zoo plans and 13 torchvision architectures (avx2, ONNX Runtime 1.32.0, 1 thread, medians of
# interleaved runs; docs/holdout.md, round 4): outputs bit-identical on every plan (one random input each);
# the six plans with such a stem ran faster (squeezenet1_1 0.67x the time, googlenet, open-nsfw and resnet18
# 0.87-0.89x, alexnet 0.90x, resnet50 0.92x); the others kept their optimised graph's op counts, at 0.97-1.02x
# (the 1.04-1.06x and 0.89x of three of them came back as 0.99-1.02x when timed again). BENCHMARKS.md at
# 834753b, *CPU plans: ONNX Runtime's QDQ propagation off* (tools/bench_cpu_sessions.py) has a side-by-side run.
DISABLED_OPTIMIZERS = ["WeightBiasQuantization", "QDQPropagationTransformer"]


# Dense INT8 convs with at least this reduction length go to ONNX Runtime's GEMM kernel when routing is on
# (trtopt.backend.cpu.lowering.route_to_gemm has the measurements behind it).
GEMM_MIN_K = 160


def has_amx_int8(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has AMX int8 tiles (Linux: the `amx_int8` flag), which ONNX Runtime's u8s8 GEMM uses."""
    return cpu_isa(cpuinfo) == "amx"


def gemm_routing(choice: str) -> bool:
    if choice not in GEMM_CHOICES:
        raise TrtoptError(f"cpu_gemm must be one of {', '.join(GEMM_CHOICES)}, got {choice!r}.")
    return choice == "on" or (choice == "auto" and has_amx_int8())


def candidate_encodings(choice: str = "auto", isa: str | None = None) -> list[str]:
    """The encodings a build tries, fastest first. `auto` leaves out u8s8 where this CPU's u8s8 kernels are
    known to saturate (trtopt.backend.cpu.isa): a few verification samples could miss a rare overflow; there
    it is u8s8p (8-bit weights whose neighbouring pairs fit the saturating sums: exact u8s8 kernels at nearly
    8-bit fidelity, `trtopt.quant.pairs`), then u8u8.
    On a CPU of unknown kind (not x86) u8s8 is tried first and kept only if it verifies."""
    if choice != "auto":
        if choice not in ENCODINGS:
            raise UnknownNameError("CPU encoding", choice, ["auto", *ENCODINGS])
        return [choice]
    isa = isa or cpu_isa()
    return ["u8s8p", "u8u8"] if isa in SATURATING_U8S8 else ["u8s8", "u8u8"]


def exact_encoding(isa: str | None = None) -> str:
    """The fastest encoding whose kernels are known to be exact on this CPU for any plan's weights (what a plan is
    re-encoded to: 7-bit weights stay int8, 8-bit ones become uint8)."""
    return "u8s8" if (isa or cpu_isa()) in EXACT_U8S8 else "u8s7"


def build(model: onnx.ModelProto, options: CpuOptions) -> tuple[dict[str, bytes], dict[str, str]]:
    """The plan: `lowered`, its data movement (Transposes, Reshapes ...) on quantised tensors
    (`trtopt.backend.cpu.movement`: exact, so the sensitivity search measures the lowered form without it)."""
    plan = lowered(model, options)
    move_quantisation(plan)
    return {"onnx": plan.SerializeToString()}, {"onnxruntime": ort.__version__, "onnx": onnx.__version__}


def lowered(model: onnx.ModelProto, options: CpuOptions) -> onnx.ModelProto:
    """`model` lowered in the first encoding `options` lets this CPU try."""
    encoding = candidate_encodings(options.encoding)[0]
    gemm_min_k = GEMM_MIN_K if gemm_routing(options.gemm) else None
    return lower_for_cpu(model, gemm_min_k=gemm_min_k, encoding=encoding, hard_gates=True)


@dataclass(frozen=True)
class KernelReport:
    """What ONNX Runtime turned the graph into after its own optimisations (the CPU backend's report)."""

    key: ClassVar[str] = "onnxruntime_kernels"
    ops: dict[str, int]
    int8_convs: int
    float_convs: int
    int8_matmuls: int
    gemm_convs: int = 0  # INT8 convs whose weights steer ONNX Runtime to its GEMM kernel (nonzero zero point)
    # INT8 layers that ONNX Runtime runs in float on dequantised weights (no integer kernel: ConvTranspose, or no
    # QuantizeLinear after the layer for its fusion to take): the plan's rounding error without its speed
    dequantized: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"int8_convs": self.int8_convs, "float_convs": self.float_convs, "int8_matmuls": self.int8_matmuls,
                "gemm_convs": self.gemm_convs, "dequantized_layers": list(self.dequantized)}  # fmt: skip

    def rows(self) -> list[tuple[str, str]]:
        gemm = f" ({self.gemm_convs} on the GEMM/AMX kernel)" if self.gemm_convs else ""
        convs = f"{self.int8_convs} INT8 convs{gemm}, {self.float_convs} float convs"
        named = ", ".join(self.dequantized[:4]) + (f" and {len(self.dequantized) - 4} more" if len(self.dequantized) > 4
                                                   else "")  # fmt: skip
        float_math = (f"; {len(self.dequantized)} INT8 layer(s) run in float on dequantised weights ({named}: no "
                      "integer kernel, or a float output such as a graph output): their rounding error without the "
                      "speed-up" if self.dequantized else "")
        return [("ONNX Runtime kernels", f"{convs}, {self.int8_matmuls} INT8 matmuls{float_math}")]


def kernel_report(model_bytes: bytes) -> KernelReport:
    """Count the kernels in ONNX Runtime's optimised graph (written via optimized_model_filepath)."""
    with tempfile.TemporaryDirectory(prefix="trtopt-kernels-") as tmp:
        path = Path(tmp, "optimized.onnx")
        # "extended" is the level at which QDQ groups become INT8 kernels; the layout pass of "all"
        # rewrites float convs to NchwcConv, which we would count as float all the same.
        options = session_options(threads=1, opt_level="extended", optimized_model_path=str(path))
        ort.InferenceSession(
            model_bytes, options, providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED_OPTIMIZERS
        )
        optimized = onnx.load_model(path, load_external_data=False)
    ops = Counter(node.op_type for node in optimized.graph.node)
    return KernelReport(
        ops=dict(ops),
        int8_convs=sum(ops[o] for o in INT8_CONV_OPS),
        float_convs=sum(ops[o] for o in FLOAT_CONV_OPS),
        int8_matmuls=sum(ops[o] for o in INT8_MATMUL_OPS),
        gemm_convs=_gemm_convs(optimized.graph),
        dequantized=_dequantized_layers(optimized.graph),
    )


def _dequantized_layers(graph: onnx.GraphProto) -> tuple[str, ...]:
    """Float Conv / ConvTranspose / Gemm / MatMul nodes whose weight comes from a DequantizeLinear: INT8 in the plan,
    float math in ONNX Runtime's optimised graph (ppocr-v4-det's p2o.ConvTranspose.0: no INT8 ConvTranspose)."""
    made_by = {out: node.op_type for node in graph.node for out in node.output}
    weighted = {"Conv", "FusedConv", "NchwcConv", "ConvTranspose", "Gemm", "MatMul", "FusedMatMul"}
    return tuple(node.name for node in graph.node if node.op_type in weighted and len(node.input) > 1
                 and made_by.get(node.input[1]) == "DequantizeLinear")  # fmt: skip


def _gemm_convs(graph: onnx.GraphProto) -> int:
    """QLinearConv nodes whose int8 weights have a nonzero zero point (input 5): steered to the u8s8 GEMM
    (uint8 weights, the u8u8 encoding, are not counted: they never take the symmetric kernel)."""
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    return sum(
        1
        for node in graph.node
        if node.op_type == "QLinearConv"
        and len(node.input) > 5
        and node.input[5] in inits
        and inits[node.input[5]].data_type == onnx.TensorProto.INT8
        and numpy_helper.to_array(inits[node.input[5]]).any()
    )
