"""The CPU backend object: ONNX Runtime's INT8 kernels, and every decision that depends on them.

`builder.py` lowers the Q/DQ graph and counts kernels, `runner.py` runs a plan; this module decides
(registered as "cpu" in `trtopt.backend.BACKENDS`). Nothing here imports ONNX Runtime at import time.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from trtopt.backend.base import (
    Backend,
    BackendStatus,
    BuildTarget,
    Rebuild,
    RunOptions,
    SpeedChoice,
    TritonModel,
    TritonServing,
)
from trtopt.backend.cpu.options import ENCODING_CHOICES, FALLBACK_CHOICES, GEMM_CHOICES, CpuOptions
from trtopt.backend.registry import BACKENDS
from trtopt.errors import TrtoptError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from trtopt.backend.base import Runner, Sections, Versions
    from trtopt.backend.cpu.builder import KernelReport
    from trtopt.backend.cpu.speed import Speed
    from trtopt.plan import Plan
    from trtopt.plan.verification import Verification
    from trtopt.quant import QuantConfig
    from trtopt.quant.thin import Wider

# ONNX Runtime turns a Conv into a QLinearConv only when its output is quantised too (DQ -> Conv -> Q), and it
# removes a Relu or Clip that feeds a QuantizeLinear whose range already clips the same values
# (onnxruntime/core/optimizer/qdq_transformer/relu_quantizelinear.cc and clip_quantizelinear.cc), so the
# output pair goes after them. Any other activation (SiLU, Sigmoid, HardSwish) or a residual Add runs in
# float after the INT8 layer.
ORT_OUTPUT_FOLDS = frozenset({"Relu", "Clip"})
# ONNX Runtime 1.32's CPU provider has no QDQ ConvTranspose fusion: it dequantises the weights and runs the float
# kernel (PP-OCRv4-det's p2o.ConvTranspose.0, a UNet decoder). A 64->32 2x2/2 deconvolution on 56x56 (avx2, 1
# thread, interleaved) ran 2.2 / 19.5 ms at b1 / b8 with Q/DQ weights and 2.4 / 19.0 ms float: the same speed,
# so the CPU backend keeps such layers float (`QuantConfig.float_ops`), with their weights exact.
NO_INT8_KERNEL = frozenset({"ConvTranspose"})

# Triton's ONNX Runtime backend loads model.onnx (platform onnxruntime_onnx; Triton's model configuration guide)
# and takes its intra-op threads from the parameter intra_op_thread_count (onnxruntime_backend README, "Model
# Config Options"); it takes every Triton tensor type but bfloat16.
TRITON_ONNXRUNTIME = TritonModel(
    name="onnxruntime",
    key="platform",
    value="onnxruntime_onnx",
    file="model.onnx",
    section="onnx",
    dtypes=frozenset({"bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16",
                      "float32", "float64"}),  # fmt: skip
    threads_parameter="intra_op_thread_count",
)


# Graph passes a CPU build leaves out of the default list. fuse_parallel_convs merges sibling 1x1 convs into one wide
# conv and a Split for TensorRT; ONNX Runtime runs sibling QLinearConvs on one uint8 input at no extra cost, while the
# Split between INT8 convs needs Q/DQ of its own. GoogLeNet (light:inception_v1, avx2, 1 thread, BENCHMARKS.md
# *CPU plans: placement against ONNX Runtime's quantizer*): 24 more QuantizeLinear and 6 more DequantizeLinear
# left after ONNX Runtime's optimiser, and no speed gained (b1 / b8 speed-ups over FP32, with / without the pass,
# u8u8: 1.08 / 1.00 against 1.11 / 1.08 in BENCHMARKS' run; 1.01 / 0.97 against 0.96 / 1.08 and 1.08 / 1.07
# against 1.12 / 1.07 in two others, u8s8 1.24 / 1.24 against 1.29 / 1.23); issue #45 measured a face detector's
# plan 15-20% faster without it at equal accuracy.
LEFT_OUT_PASSES = ("fuse_parallel_convs",)


class CpuBackend(Backend[CpuOptions]):
    name = "cpu"
    title = "ONNX Runtime CPU"
    options_type = CpuOptions
    runner_section = "onnx"
    auto_rank = 1
    auto_reason = "the CPU backend is always available"
    cpu_runtime = True
    mismatch_fix = "Build with --cpu-encoding auto (or u8u8, exact on every x86 CPU), "
    # Measured on ONNX Runtime's quantize_static output: uint8 activations build and verify in QDQ and QOperator
    # form, int8 activations in QDQ form (the lowering moves each pair's grid to uint8 exactly); int8 QOperator
    # graphs (QLinearConv on int8) ONNX Runtime's CPU kernels refuse.
    prequantized_keeps = ("uint8 activations (ONNX Runtime's quantize_static(..., activation_type=QuantType.QUInt8)), "
                          "or int8 ones in QDQ form")
    sparsity_note = (
        "ONNX Runtime's CPU kernels have no 2:4 sparse path: on this backend --sparsity only lists the layers."
    )

    # Served by default through Triton's Python backend (trtopt.serving.triton.python_model), which runs the plan
    # as trtopt.Engine does (re-encoding INT8 weights for CPUs whose u8s8 kernels saturate) and reads images; or
    # by Triton's ONNX Runtime backend from the plan's lowered model. Instances on the CPU.
    triton = TritonServing(models=(TRITON_ONNXRUNTIME,), default="python", instance_kind="KIND_CPU")

    def status(self) -> BackendStatus:
        import onnxruntime as ort

        return BackendStatus(True, f"ONNX Runtime {ort.__version__} CPU")

    def quant_config(self, quant: QuantConfig, options: CpuOptions | None = None) -> QuantConfig:
        """Quantised layer outputs (`ORT_OUTPUT_FOLDS`), pooling on the integer grid between INT8 layers
        (`QuantConfig.integer_pools`, `trtopt.quant.pools`: ONNX Runtime's uint8 NhwcMaxPool, QLinearAdd and
        QLinearGlobalAveragePool; torchvision ResNet-18 from 0.93-0.97x to 1.00-1.01x the speed of ONNX Runtime's
        own quantizer's plan at b1 / b8, docs/exports.md), a depthwise conv fed by a float layer kept float
        unless the user said otherwise (`QuantConfig.float_leading_depthwise`), and for a build whose encoding
        (`options`) has 7-bit weights (u8s7), the search for the dense layers that get them
        (`trtopt.search.seven_bit`); for u8s8p (auto on CPUs whose u8s8 kernels saturate), 8-bit weights with
        neighbouring pairs that fit those kernels (`trtopt.quant.pairs`). Element-wise gates between INT8 layers
        run on the integer grid too (`QuantConfig.integer_gates`, `trtopt.quant.gates`: SiLU and squeeze-excite
        blocks as ONNX Runtime's QLinearSigmoid, QLinearMul and QLinearGlobalAveragePool), and such a plan leaves
        SiLU out of the gated activation equalisation (`trtopt.quant.equalize.find_sites`), whose per-channel Mul
        would run in float between them.

        Why the gates (issue #45; AMD EPYC, avx2, ONNX Runtime 1.32.0, 1 thread, calls interleaved, the
        real-export corpus's Keras EfficientNet-B0 through tf2onnx, u8s7 plans; load average 4-12 on 2 shared
        cores): the plan before kept 33 SiLUs as float QuickGelu, 25 Sigmoids, 47 Muls and 17 pools float
        behind 77 DequantizeLinear and 59 QuantizeLinear, and ran at 0.85x / 0.89x FP32's speed at b1 / b8
        (0.93x / 0.70x ONNX Runtime's own quantizer's plan), so the speed check wrote the float plan. Gates on
        the grid with SiLU still equalised (a float Mul in each gate branch): 0.98x / 1.12x. Without SiLU
        equalisation (56 QLinearSigmoid, 56 QLinearMul, 16 QLinearGlobalAveragePool, 6 DequantizeLinear
        left): 1.38x / 1.72x (1.33x ONNX Runtime's at both; `tools/compare_ort_plans.py time`, 9 rounds). In
        `tools/bench_exports.py`: 1.46x / 1.90x FP32's speed against ONNX Runtime's 1.10x / 1.36x (1.26x /
        1.59x with reduce_range). On the zoo's pretrained models (default build, 32 calibration, 16 held-out
        samples): ddddocr's YOLOX detector (63 SiLUs, 64 now QLinearSigmoid + QLinearMul) 1.37x -> 1.52x FP32's
        speed at b1, worst output cosine 0.9902 -> 0.9919, box F1 92.4% -> 93.0%; table-cls unchanged (0.9953,
        top-1 100%); PP-OCRv4-rec's three SiLUs in its neck on the grid cost fidelity: 0.9884 -> 0.9844, exact
        lines 62.5% -> 56.3% (ONNX Runtime's quantizer: 0.9151); the sensitivity search does not yet weigh gates.
        MobileNetV3's HardSwish, HardSigmoid gates and global ReduceMean pools too (`QuantConfig.integer_hard_swish`:
        ONNX Runtime's QLinearAdd and QLinearMul, `trtopt.backend.cpu.hard_gates`; avx2, docs/exports.md): the
        corpus's mobilenet_v3_small exports from 0.72-1.08x to 0.99-1.32x FP32's speed at b1 and b8 (ONNX Runtime's
        quantizer 0.79-1.14x), the zoo's table-cls from 1.04-1.11x to 1.44-1.61x at b1, worst held-out cosine
        0.9924 -> 0.9884 at equal top-1 agreement (ONNX Runtime's quantizer 0.5992); that cosine was the HardSwish
        equalisation such plans then left out, kept since with its gate on the grid too (`trtopt.quant.gates`).

        Why the depthwise default: MLAS's INT8 depthwise kernel runs at FP32 speed (EfficientNet-Lite0's 16
        depthwise convs: 0.6x to 1.8x each, 1.0x in total, 1 thread), the float -> INT8 conversion only moves
        one layer later onto a tensor no larger (a depthwise conv keeps the channel count), and a depthwise
        conv is the layer type INT8 weights hurt most (9 or 25 weights per channel, scaled up by BatchNorm
        folding). Measured on EfficientNet-Lite0's first block (bias correction on): 3-4 % lower latency at
        batch 1 and 8, and 1 - cosine to FP32 on held-out photos 0.00112 instead of 0.00154.
        """
        from trtopt.calib.thresholds import FP32_AMAX

        leading = True if quant.float_leading_depthwise is None else quant.float_leading_depthwise
        widen = quant.min_channels is None and quant.float_leading_depthwise is None  # trtopt.quant.thin
        quant = replace(quant, quantize_outputs=True, output_folds=ORT_OUTPUT_FOLDS, float_leading_depthwise=leading,
                        integer_pools=True, integer_gates=True, integer_hard_swish=True, min_amax=FP32_AMAX,
                        float_ops=quant.float_ops | NO_INT8_KERNEL)
        if options is None:
            return quant
        quant = replace(quant, widen_thin=widen and options.fallback != "off")
        from trtopt.backend.cpu.builder import candidate_encodings
        from trtopt.backend.cpu.lowering import ENCODINGS

        encoding = ENCODINGS[candidate_encodings(options.encoding)[0]]
        return replace(quant, seven_bit_search=encoding.seven_bit, pair_bounded_weights=encoding.pairs)

    def options(self, target: BuildTarget, graph: gs.Graph) -> CpuOptions:
        if target.fp16:
            raise TrtoptError(
                "--fp16 is for the TensorRT backend; this build uses the CPU backend.",
                fix="Drop --fp16 for CPU plans (ONNX Runtime's CPU kernels gain nothing from FP16), or build with "
                "--backend tensorrt on a GPU machine. `trtopt.precision.convert_to_fp16` converts an ONNX file alone.",
            )
        return target.options_for(CpuOptions)

    def variants(self, options: CpuOptions) -> list[tuple[str, CpuOptions]]:
        """The INT8 weight encodings this CPU may run exactly, fastest first (each verified in turn)."""
        from trtopt.backend.cpu import builder

        return [(e, replace(options, encoding=e)) for e in builder.candidate_encodings(options.encoding)]

    def build(self, model: onnx.ModelProto, options: CpuOptions) -> tuple[Sections, Versions]:
        from trtopt.backend.cpu import builder

        return builder.build(model, options)

    def measured_form(self, model: onnx.ModelProto, options: CpuOptions) -> onnx.ModelProto:
        """The lowered graph `build` writes (`trtopt.backend.cpu.lowering`: uint8 activations, twice the
        resolution on non-negative tensors, int32 biases), in the encoding the build tries first: PP-OCRv4-rec
        measured in TensorRT's form scored 0.960 on held-out lines where its built plan scored 0.974.

        Same grids, not the same numbers: the search runs this form with ONNX Runtime's optimisations off,
        the plan runs with them on, where ONNX Runtime fuses DQ -> Conv/MatMul -> Q into QLinearConv /
        QLinearMatMul, which round differently. On PP-OCRv4-rec (avx2, 32 calibration lines) the same
        plan scores 0.9951 on the search's 16 lines as measured and 0.9912 as it runs, the all-INT8 plan
        0.9809 and 0.9861 on the 8 confirmation lines (with the QDQ fusions off, `session.disable_quant_qdq`,
        0.9833); ONNX Runtime's float fusions (LayerNormalization, QuickGelu) change nothing there.
        Searching in the form as it runs made the search's figures exact but did not lift held-out lines
        (64 held-out lines: 0.9884 -> 0.9837, 32 unseen calibration-seed lines 0.9910 -> 0.9944)."""
        from trtopt.backend.cpu import builder

        return builder.lowered(model, options)

    def machine(self) -> str:
        from trtopt.backend.cpu.isa import cpu_isa

        return f"this {cpu_isa()} CPU"

    def report(self, plan: Plan, options: CpuOptions) -> KernelReport | None:
        """Which kernels ONNX Runtime made of an INT8 plan. The plan already verified, so a failure here is
        reported, not a traceback."""
        from trtopt.backend.cpu.builder import kernel_report
        from trtopt.frontend.model_errors import plan_errors

        if not plan.metadata.int8:
            return None
        try:
            return kernel_report(plan.sections["onnx"])
        except plan_errors() as exc:
            raise TrtoptError(
                f"ONNX Runtime could not optimise the built plan: {str(exc).strip().splitlines()[0]} Nothing was "
                "written.",
                fix="This is a bug in trtopt's CPU lowering: please report it with the model; meanwhile try "
                "--passes ''.",
            ) from None

    def passes(self, chosen: Sequence[str] | None) -> tuple[str, ...] | None:
        """The default passes with `rewrite_prelu` after the layout clean-up: ONNX Runtime's PRelu kernel took 6.7x
        the time of the exact Max(x, x * slope) it becomes (trtopt.passes.rewrite_prelu); `rewrite_hard_swish`, which
        writes HardSwish and HardSigmoid spelt in Clip arithmetic as the ops this backend runs on the integer grid
        (`trtopt.backend.cpu.hard_gates`); `channel_shuffle` after the shape chains are collapsed (ONNX Runtime's
        Gather moves the channels in 0.58-0.74x the time of Reshape, Transpose, Reshape; trtopt.passes.channel_shuffle);
        without `LEFT_OUT_PASSES`, which cost on ONNX Runtime; a user's list as given."""
        if chosen is not None:
            return tuple(chosen)
        from trtopt.passes import DEFAULT_ORDER

        order = tuple(p for p in DEFAULT_ORDER if p not in LEFT_OUT_PASSES)
        at, shuffle = order.index("sink_transposes") + 1, order.index("collapse_reshapes") + 1
        return (*order[:at], "rewrite_prelu", "rewrite_hard_swish", *order[at:shuffle], "channel_shuffle",
                *order[shuffle:])

    def speed(self, plan: Plan, fp32: onnx.ModelProto, feeds: Mapping[str, Any]) -> Speed | None:
        """An INT8 plan's time against FP32's on this CPU, one thread each (`trtopt.backend.cpu.speed`)."""
        found = self._timed([plan], fp32, feeds) if plan.metadata.int8 else None
        return found[0] if found else None

    def faster(
        self, plan: Plan, options: CpuOptions, verification: Verification | None, model: onnx.ModelProto,
        fp32: onnx.ModelProto, feeds: Mapping[str, Any], rebuild: Rebuild, wider: Wider | None = None,
    ) -> SpeedChoice:  # fmt: skip
        """The INT8 plan, or where it runs slower than FP32 here, the fastest of its cheaper forms that verifies:
        INT8 regions kept float, or the float plan (`trtopt.backend.cpu.choice`)."""
        from trtopt.backend.cpu.choice import faster_plan

        timed = partial(self._timed, fp32=fp32, feeds=feeds)
        return faster_plan(plan, verification, model, fp32, rebuild, timed, options.fallback, wider)

    def _timed(self, plans: Sequence[Plan], fp32: onnx.ModelProto, feeds: Mapping[str, Any]) -> list[Speed] | None:
        """Each of `plans` timed against FP32, side by side (`trtopt.backend.cpu.speed.measure_speeds`)."""
        from trtopt.backend.cpu.isa import EXACT_U8S8, cpu_isa
        from trtopt.backend.cpu.speed import measure_speeds
        from trtopt.frontend.model_errors import plan_errors

        failures: tuple[type[BaseException], ...] = (TrtoptError, *plan_errors())
        runners: list[Runner] = []
        try:
            runners += [self.create_runner(plan, RunOptions(threads=1)) for plan in plans]
            calls = [runner.infer for runner in runners]
            return measure_speeds(fp32, calls, feeds, self.machine(), cpu_isa() in EXACT_U8S8)
        except failures as exc:  # a figure for the summary: never a reason to fail the build
            log.warning("no speed figure: timing the plan against FP32 failed (%s)", str(exc).strip().splitlines()[0])
            return None
        finally:
            for runner in runners:
                runner.close()

    def triton_notes(self, plan: Plan, model: TritonModel) -> list[str]:
        verification = plan.metadata.get("verification") or {}
        if model.section != self.runner_section or verification.get("variant") != "u8s8":
            return []
        return [
            f"{model.file} stores int8 weights (u8s8, verified on an {verification.get('isa', 'avx512_vnni')} CPU): "
            "exact only on servers with AVX-512 VNNI, AVX-VNNI or AMX. For AVX2 servers rebuild with --cpu-encoding "
            "u8s8p, or serve with --triton-backend python, which re-encodes where needed."
        ]

    def create_runner(self, plan: Plan, options: RunOptions) -> Runner:
        from trtopt.backend.cpu import runner

        return runner.create_runner(plan, options)

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--cpu-gemm",
            choices=GEMM_CHOICES,
            default=CpuOptions.gemm,
            help="CPU plans: run INT8 convs with long reductions (C_in*kh*kw >= 160) on ONNX Runtime's GEMM kernel, "
            "which uses AMX; auto (default): on where this CPU has AMX. Same results either way, only speed differs",
        )
        group.add_argument(
            "--cpu-encoding",
            choices=ENCODING_CHOICES,
            default=CpuOptions.encoding,
            help="CPU plans: how INT8 weights are stored for ONNX Runtime. u8s8 (int8 weights) is fastest but exact "
            "only on CPUs with VNNI or AMX: on AVX2-only CPUs its kernels saturate 16-bit sums. u8u8 (the same "
            "values as uint8) is exact on every x86 CPU, and slower. u8s7: the dense layers whose fidelity allows it "
            "(measured at build) get 7-bit weights, which u8s8 kernels run exactly everywhere, the others u8u8. "
            "u8s8p: 8-bit weights, each channel's grid widened only where two neighbouring weights could saturate "
            "those sums: u8s8 kernels, exact everywhere, nearly 8-bit fidelity. auto (default): u8s8 where it is "
            "exact, else u8s8p; the build verifies the choice either way",
        )

        group.add_argument(
            "--cpu-fallback",
            choices=FALLBACK_CHOICES,
            default=CpuOptions.fallback,
            help="CPU plans: where the INT8 plan runs slower than FP32 on this CPU, auto (default) keeps the INT8 "
            "regions that do not pay in float, or writes the float plan, and says so (the float plan too where the "
            "INT8 plan's outputs have nothing in common with FP32's); off writes the INT8 plan anyway (to serve on "
            "a CPU where INT8 is faster)",
        )

    def options_from_args(self, args: argparse.Namespace) -> CpuOptions:
        return CpuOptions(gemm=args.cpu_gemm, encoding=args.cpu_encoding, fallback=args.cpu_fallback)


BACKENDS.add(CpuBackend.name, CpuBackend())
