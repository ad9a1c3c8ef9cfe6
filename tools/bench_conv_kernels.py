#!/usr/bin/env python3
"""One INT8 conv at a time on ONNX Runtime's CPU kernels: its symmetric-conv kernel (int8 weights, zero
point 0), its im2col + u8s8 GEMM kernel (the same weights stored as q - 1, zero point -1) and its u8u8
kernel (the same weights as uint8 q + 128, zero point 128: trtopt's `u8u8` encoding), with the FP32 conv
beside them. Each INT8 output is also compared with the exact result (integer sums in float64, then
requantised), in quantisation steps: on CPUs without VNNI or AMX the u8s8 kernels saturate their 16-bit
pair sums (trtopt.backend.cpu.isa). This is the measurement behind `trtopt.backend.cpu.lowering.ENCODINGS`,
`route_to_gemm` and its threshold `GEMM_MIN_K`; rerun it to check them on another CPU.

    python tools/bench_conv_kernels.py [--batch 1] [--iterations 30] [--warmup 3] [--out FILE.md]

Each INT8 conv is the NHWC QLinearConv (com.microsoft, channels_last=1) that ONNX Runtime's layout pass
makes of trtopt's CPU plans, so no transposes are timed; FP32 is the plain NCHW Conv, which ONNX
Runtime runs in its NCHWc layout. Shapes: the convs of EfficientNet-Lite0 and ResNet-50. Timing: one
call of each variant per round, rotating the order (tools/benchlib.py's `interleaved`); medians.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import emit, header_lines, interleaved, load_average  # noqa: E402

from trtopt.backend.cpu.builder import GEMM_MIN_K, has_amx_int8  # noqa: E402
from trtopt.backend.cpu.isa import cpu_isa  # noqa: E402

# (model, C_in, C_out, H=W of the input, kernel, group)
FP32 = "FP32"
SHAPES = (
    ("EfficientNet-Lite0", 16, 96, 112, 1, 1),
    ("EfficientNet-Lite0", 24, 144, 56, 1, 1),
    ("EfficientNet-Lite0", 144, 24, 56, 1, 1),
    ("EfficientNet-Lite0", 40, 240, 28, 1, 1),
    ("EfficientNet-Lite0", 80, 480, 14, 1, 1),
    ("EfficientNet-Lite0", 480, 80, 14, 1, 1),
    ("EfficientNet-Lite0", 112, 672, 14, 1, 1),
    ("EfficientNet-Lite0", 672, 112, 14, 1, 1),
    ("EfficientNet-Lite0", 192, 1152, 7, 1, 1),
    ("EfficientNet-Lite0", 1152, 320, 7, 1, 1),
    ("EfficientNet-Lite0", 320, 1280, 7, 1, 1),
    ("EfficientNet-Lite0", 480, 480, 14, 5, 480),
    ("ResNet-50", 64, 256, 56, 1, 1),
    ("ResNet-50", 128, 128, 28, 3, 1),
    ("ResNet-50", 256, 1024, 14, 1, 1),
    ("ResNet-50", 512, 512, 7, 3, 1),
)
SYM, GEMM, U8U8 = "symmetric kernel", "GEMM kernel", "u8u8 kernel"
X_SCALE, W_SCALE = 0.02, 0.01


def weights(cin: int, cout: int, k: int, group: int) -> np.ndarray:
    return np.random.default_rng(0).integers(-127, 128, (cout, cin // group, k, k)).astype(np.int16)


def y_scale(cin: int, k: int, group: int) -> float:
    """An output scale that keeps most requantised values inside uint8 (sums of K terms grow like sqrt(K))."""
    return X_SCALE * W_SCALE * 128 * 74 * float(np.sqrt(cin // group * k * k)) / 48


def int8_conv(cin: int, cout: int, k: int, group: int, weight_zero: int) -> bytes:
    q = weights(cin, cout, k, group) + weight_zero
    wtype = np.uint8 if weight_zero == 128 else np.int8
    consts = {
        "w": q.astype(wtype),
        "x_scale": np.array(X_SCALE, np.float32),
        "x_zero": np.array(128, np.uint8),
        "w_scale": np.full(cout, W_SCALE, np.float32),
        "w_zero": np.full(cout, weight_zero, wtype),
        "y_scale": np.array(y_scale(cin, k, group), np.float32),
        "y_zero": np.array(128, np.uint8),
    }
    node = helper.make_node(
        "QLinearConv", ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero"], ["y"],
        domain="com.microsoft", kernel_shape=[k, k], pads=[k // 2] * 4, group=group, channels_last=1,
    )  # fmt: skip
    return _model(node, TensorProto.UINT8, consts, ("com.microsoft", 1))


def exact_conv(cin: int, cout: int, k: int, group: int, x8: np.ndarray) -> np.ndarray:
    """The requantised output the INT8 conv means: integer sums (exact in float64: below 2^53), scaled,
    rounded half to even like ONNX Runtime's requantisation, plus the zero point; NHWC like the kernels."""
    w = weights(cin, cout, k, group).astype(np.float64)  # [cout, cin/group, k, k]
    x = np.pad(x8.astype(np.float64) - 128, ((0, 0), (k // 2,) * 2, (k // 2,) * 2, (0, 0)))
    n, hw = x8.shape[0], x8.shape[1]
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))  # [n, hw, hw, cin, k, k]
    per_group, outs = cin // group, cout // group
    sums = np.empty((n, hw, hw, cout))
    for g in range(group):
        patch = windows[..., g * per_group : (g + 1) * per_group, :, :].reshape(n, hw, hw, -1)
        sums[..., g * outs : (g + 1) * outs] = patch @ w[g * outs : (g + 1) * outs].reshape(outs, -1).T
    scale = X_SCALE * W_SCALE / np.float32(y_scale(cin, k, group))
    return np.clip(np.rint(sums * scale) + 128, 0, 255)


def fp32_conv(cin: int, cout: int, k: int, group: int) -> bytes:
    w = np.random.default_rng(0).standard_normal((cout, cin // group, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[k, k], pads=[k // 2] * 4, group=group)
    return _model(node, TensorProto.FLOAT, {"w": w})


def _model(node: object, dtype: int, consts: dict[str, np.ndarray], *domains: tuple[str, int]) -> bytes:
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", dtype, None)],
        [helper.make_tensor_value_info("y", dtype, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 13)] + [helper.make_opsetid(d, v) for d, v in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def session(model: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def caller(sess: ort.InferenceSession, x: np.ndarray) -> Callable[[], object]:
    return lambda: sess.run(None, {"x": x})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=30, help="timed rounds per conv (default 30)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    load_before = load_average()
    rng = np.random.default_rng(1)
    rows = []
    for model, cin, cout, hw, k, group in SHAPES:
        x8 = rng.integers(0, 256, (args.batch, hw, hw, cin)).astype(np.uint8)
        x32 = rng.standard_normal((args.batch, cin, hw, hw)).astype(np.float32)
        runs = {name: session(int8_conv(cin, cout, k, group, zero)) for name, zero in ((SYM, 0), (GEMM, -1),
                                                                                       (U8U8, 128))}  # fmt: skip
        fp32 = session(fp32_conv(cin, cout, k, group))
        exact = exact_conv(cin, cout, k, group, x8)
        errors = {n: np.abs(s.run(None, {"x": x8})[0].astype(np.float64) - exact).max() for n, s in runs.items()}
        calls = {FP32: caller(fp32, x32)} | {name: caller(s, x8) for name, s in runs.items()}
        t = interleaved(calls, args.warmup, args.iterations, args.batch)
        reduction = cin // group * k * k
        routed = group == 1 and reduction >= GEMM_MIN_K
        shape = f"{cin}->{cout} {k}x{k}" + (" depthwise" if group > 1 else "") + f" @ {hw}x{hw}"
        rows.append(
            f"| {model} | {shape} | {reduction} | {t.p50(FP32):.3f} | {t.p50(SYM):.3f} | {t.p50(GEMM):.3f} "
            f"| {t.speedup(SYM):.2f}x | {t.speedup(GEMM):.2f}x "
            f"| **{t.p50(SYM) / t.p50(GEMM):.2f}x** | {'GEMM' if routed else 'symmetric'} "
            f"| {t.p50(U8U8):.3f} | {errors[SYM]:.0f} | {errors[GEMM]:.0f} | {errors[U8U8]:.0f} |"
        )
    lines = [
        "## INT8 conv kernels on ONNX Runtime CPU: symmetric conv vs GEMM",
        "",
        *header_lines("tools/bench_conv_kernels.py", sys.argv[1:] if argv is None else argv),
        f"- 1-minute load average {load_before} before, {load_average()} after",
        f"- CPU class {cpu_isa()} (trtopt.backend.cpu.isa); AMX int8: {'yes' if has_amx_int8() else 'no'}; "
        f"batch {args.batch}, 1 thread, "
        f"{args.warmup} warm-up + {args.iterations} timed rounds per conv, interleaved; times are medians in ms",
        "",
        "| model | conv | K = C_in/group·kh·kw | FP32 | INT8 symmetric | INT8 GEMM | FP32 / symmetric "
        "| FP32 / GEMM | GEMM speed-up over symmetric | trtopt's choice (--cpu-gemm on) | INT8 u8u8 "
        "| max error symmetric | max error GEMM | max error u8u8 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"trtopt routes a dense conv to the GEMM kernel when K >= {GEMM_MIN_K} (`GEMM_MIN_K`) and the CPU has "
        "AMX (`--cpu-gemm auto`). All INT8 columns hold the same weights. The max error columns are each kernel's "
        "largest distance, in output quantisation steps, from the exact requantised result (random uint8 inputs "
        "and int8 weights over the whole range): 0 or 1 is rounding; more is the kernel saturating, which trtopt's "
        "`u8u8` encoding avoids on CPUs without VNNI or AMX.",
    ]
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
