"""CPU build: lower the Q/DQ graph for ONNX Runtime and check that its INT8 kernels took it."""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort

from trtopt.backend import BackendStatus, BuildOptions
from trtopt.backend.cpu.lowering import lower_for_cpu
from trtopt.execution.ort_session import session_options

INT8_CONV_OPS = {"QLinearConv", "ConvInteger"}
INT8_MATMUL_OPS = {"QLinearMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm"}
FLOAT_CONV_OPS = {"Conv", "FusedConv", "NchwcConv"}
# ONNX Runtime's WeightBiasQuantization transformer quantises the float weights of a Conv/Gemm/MatMul
# whose input comes from a DequantizeLinear and whose output goes to a QuantizeLinear. trtopt quantises
# every weight it means to itself, so that transformer only ever overrides a user's `--exclude` (an
# excluded layer between two INT8 layers); it is switched off for every CPU session.
DISABLED_OPTIMIZERS = ["WeightBiasQuantization"]


def status() -> BackendStatus:
    return BackendStatus(True, f"ONNX Runtime {ort.__version__} CPU")


def build(model: onnx.ModelProto, options: BuildOptions) -> tuple[dict[str, bytes], dict[str, str]]:
    lowered = lower_for_cpu(model)
    return {"onnx": lowered.SerializeToString()}, {"onnxruntime": ort.__version__, "onnx": onnx.__version__}


@dataclass(frozen=True)
class KernelReport:
    """What ONNX Runtime turned the graph into after its own optimisations."""

    ops: dict[str, int]
    int8_convs: int
    float_convs: int
    int8_matmuls: int

    @property
    def all_convs_int8(self) -> bool:
        return self.float_convs == 0


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
    )
