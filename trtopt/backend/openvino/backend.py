"""The OpenVINO backend object: OpenVINO's CPU plugin running the plan's Q/DQ graph, and what depends on it.

`builder.py` writes the Q/DQ graph and reads back the compiled model's layer precisions, `runner.py` runs a
plan; this module decides (registered as "openvino" in `trtopt.backend.BACKENDS`). Nothing here imports
OpenVINO at import time, so `trtopt build --help` lists this backend where OpenVINO is not installed.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from trtopt.backend.base import Backend, BackendStatus, BuildTarget, Rebuild, RunOptions, SpeedChoice
from trtopt.backend.openvino.options import FALLBACK_CHOICES, FORM_CHOICES, OpenvinoOptions
from trtopt.backend.registry import BACKENDS
from trtopt.errors import TrtoptError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from trtopt.backend.base import Runner, Sections, Versions
    from trtopt.backend.cpu.speed import Speed
    from trtopt.backend.openvino.builder import PrecisionReport
    from trtopt.plan import Plan
    from trtopt.plan.verification import Verification
    from trtopt.quant import QuantConfig
    from trtopt.quant.thin import Wider

# Narrower layers stay float unless --min-channels says otherwise: 1 quantises the 3-channel stem conv, which
# OpenVINO runs in INT8 (u8 input, 7-bit weights on AVX2) at 10% of a ResNet-18's time (trtopt.backend.openvino).
OPENVINO_MIN_CHANNELS = 1

INSTALL_HINT = 'Install OpenVINO with `pip install "trtopt[openvino]"` (or `pip install openvino`).'


class OpenvinoBackend(Backend[OpenvinoOptions]):
    name = "openvino"
    title = "OpenVINO CPU"
    options_type = OpenvinoOptions
    runner_section = "onnx"
    install_hint = INSTALL_HINT
    auto_rank = 2  # after the CPU backend: `--backend auto` times the two (trtopt.auto_backend)
    auto_reason = "OpenVINO is installed"
    cpu_runtime = True
    mismatch_fix = "Build with --backend cpu (ONNX Runtime's exact u8u8 kernels), "
    sparsity_note = "OpenVINO's CPU plugin has no 2:4 sparse path for these plans: --sparsity only lists the layers."

    def status(self) -> BackendStatus:
        try:
            import openvino as ov
        except ImportError:
            return BackendStatus(False, "OpenVINO is not installed (the `openvino` extra)")
        return BackendStatus(True, f"OpenVINO {ov.__version__} CPU")

    def quant_config(self, quant: QuantConfig, options: OpenvinoOptions | None = None) -> QuantConfig:
        """The CPU backend's placement (quantised layer outputs after Relu / Clip, both inputs of a residual Add,
        depthwise convs after float layers kept float), with layers of every width quantised by default
        (`OPENVINO_MIN_CHANNELS`: the stem conv too, as NNCF does): the placement OpenVINO ran fastest, each
        difference measured (trtopt.backend.openvino). Where the first form tried is "lowered-pairs", the weights
        are pair-bounded when quantised, from the float weights (`QuantConfig.pair_bounded_weights`; the form's own
        pass then only widens what oneDNN pairs otherwise: input channels padded per tap where there are an odd
        number of them)."""
        from trtopt.backend.cpu.backend import ORT_OUTPUT_FOLDS
        from trtopt.backend.openvino.builder import candidate_forms
        from trtopt.calib.thresholds import FP32_AMAX

        leading = True if quant.float_leading_depthwise is None else quant.float_leading_depthwise
        channels = OPENVINO_MIN_CHANNELS if quant.min_channels is None else quant.min_channels
        pairs = options is not None and candidate_forms(options.form)[0] == "lowered-pairs"
        widen = options is not None and options.fallback != "off" and quant.float_leading_depthwise is None
        return replace(quant, quantize_outputs=True, output_folds=ORT_OUTPUT_FOLDS, float_leading_depthwise=leading,
                       min_channels=channels, pair_bounded_weights=pairs, min_amax=FP32_AMAX,
                       widen_thin=widen and quant.min_channels is None)  # fmt: skip

    def options(self, target: BuildTarget, graph: gs.Graph) -> OpenvinoOptions:
        if target.fp16:
            raise TrtoptError(
                "--fp16 is for the TensorRT backend; this build uses the OpenVINO backend.",
                fix="Drop --fp16 for OpenVINO plans (they run float layers in f32 on the CPU), or build with "
                "--backend tensorrt on a GPU machine.",
            )
        return target.options_for(OpenvinoOptions)

    def variants(self, options: OpenvinoOptions) -> list[tuple[str, OpenvinoOptions]]:
        """The Q/DQ forms this CPU may run exactly, in order (`builder.candidate_forms`; each verified in turn)."""
        from trtopt.backend.openvino.builder import candidate_forms

        return [(form, replace(options, form=form)) for form in candidate_forms(options.form)]

    def build(self, model: onnx.ModelProto, options: OpenvinoOptions) -> tuple[Sections, Versions]:
        from trtopt.backend.openvino import builder

        return builder.build(model, options)

    def measured_form(self, model: onnx.ModelProto, options: OpenvinoOptions) -> onnx.ModelProto:
        """The graph the plan stores (`builder.written`): OpenVINO computes on its grids."""
        from trtopt.backend.openvino import builder

        return builder.written(model, options)

    def machine(self) -> str:
        from trtopt.backend.cpu.isa import cpu_isa

        return f"this {cpu_isa()} CPU (OpenVINO)"

    def report(self, plan: Plan, options: OpenvinoOptions) -> PrecisionReport | None:
        """Which layers OpenVINO's CPU plugin runs in INT8, from its compiled model (the plan already verified)."""
        from trtopt.backend.openvino.builder import precision_report

        if not plan.metadata.int8:
            return None
        try:
            return precision_report(plan)
        except RuntimeError as exc:  # OpenVINO raises RuntimeError subclasses; a summary row, not a failed build
            log.warning("no OpenVINO layer report: %s", str(exc).strip().splitlines()[0])
            return None

    def speed(self, plan: Plan, fp32: onnx.ModelProto, feeds: Mapping[str, Any]) -> Speed | None:
        """An INT8 plan's time against FP32 on ONNX Runtime, one thread each (`trtopt.backend.cpu.speed`)."""
        found = self._timed([plan], fp32, feeds) if plan.metadata.int8 else None
        return found[0] if found else None

    def _timed(self, plans: Sequence[Plan], fp32: onnx.ModelProto, feeds: Mapping[str, Any]) -> list[Speed] | None:
        """Each of `plans` timed against FP32 on ONNX Runtime, side by side (`trtopt.backend.cpu.speed`)."""
        from trtopt.backend.cpu.isa import EXACT_U8S8, cpu_isa
        from trtopt.backend.cpu.speed import measure_speeds

        runners: list[Runner] = []
        try:
            runners += [self.create_runner(plan, RunOptions(threads=1)) for plan in plans]
            calls = [runner.infer for runner in runners]
            return measure_speeds(fp32, calls, feeds, self.machine(), cpu_isa() in EXACT_U8S8, "OpenVINO")
        except (TrtoptError, RuntimeError) as exc:  # a figure for the summary: never a reason to fail the build
            log.warning("no speed figure: timing the plan against FP32 failed (%s)", str(exc).strip().splitlines()[0])
            return None
        finally:
            for runner in runners:
                runner.close()

    def faster(
        self, plan: Plan, options: OpenvinoOptions, verification: Verification | None, model: onnx.ModelProto,
        fp32: onnx.ModelProto, feeds: Mapping[str, Any], rebuild: Rebuild, wider: Wider | None = None,
    ) -> SpeedChoice:  # fmt: skip
        """As the CPU backend's: the INT8 plan, or where it runs slower than FP32 here, the fastest of its cheaper
        forms that verifies (INT8 regions kept float, or the float plan; `trtopt.backend.cpu.choice`). A plan is
        never slower than the float model on the backend it is built for (issue #45): the corpus's MobileNetV3
        (torchvision, dynamo) ran its INT8 OpenVINO plan at 1.48x FP32's time on an avx2 EPYC, its HardSwish
        gates in float between INT8 convs."""
        from trtopt.backend.cpu.choice import faster_plan

        timed = partial(self._timed, fp32=fp32, feeds=feeds)
        return faster_plan(plan, verification, model, fp32, rebuild, timed, options.fallback, wider)

    def create_runner(self, plan: Plan, options: RunOptions) -> Runner:
        from trtopt.backend.openvino import runner

        return runner.create_runner(plan, options)

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--ov-form",
            choices=FORM_CHOICES,
            default=OpenvinoOptions.form,
            help="OpenVINO plans: the Q/DQ graph OpenVINO compiles: lowered (uint8 activations, as the CPU backend "
            "writes them; exact on CPUs with VNNI or AMX), lowered-pairs (the same with 8-bit weights rescaled "
            "where two products could overflow AVX2's int16 sums, exact on AVX2 CPUs too), lowered-w7 (7-bit "
            "weights), qdq (symmetric int8 activations, as for TensorRT); auto (default): the most faithful form "
            "exact on this CPU, verified either way",
        )
        group.add_argument(
            "--ov-streams", type=int, default=None,
            help="OpenVINO plans: CPU streams, inferences run at once (default 1: the lowest latency per call)",
        )  # fmt: skip
        group.add_argument(
            "--ov-fallback", choices=FALLBACK_CHOICES, default=OpenvinoOptions.fallback,
            help="OpenVINO plans: auto (default) keeps INT8 regions float, or writes the float plan, where the INT8 "
            "plan runs slower than FP32 on this CPU (timed at build) or has nothing in common with FP32's outputs; "
            "off keeps the INT8 plan as verified",
        )  # fmt: skip

    def options_from_args(self, args: argparse.Namespace) -> OpenvinoOptions:
        return OpenvinoOptions(form=args.ov_form, streams=args.ov_streams, fallback=args.ov_fallback)


BACKENDS.add(OpenvinoBackend.name, OpenvinoBackend())
