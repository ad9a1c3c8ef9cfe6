"""The TensorRT backend object: every decision that depends on TensorRT (registered as "tensorrt").

`detect.py` says whether TensorRT is usable here, `builder.py` builds an engine, `runner.py` runs one; this
module decides. Nothing here imports `tensorrt` or CUDA: the object is constructed, asked for its status
and listed in `--help` on machines without them.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from trtopt.backend.base import Backend, BackendStatus, BuildTarget, Profile, RunOptions, TritonModel, TritonServing
from trtopt.backend.registry import BACKENDS
from trtopt.backend.tensorrt.options import TensorRTOptions

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from trtopt.backend.base import Runner, Sections, Versions
    from trtopt.backend.tensorrt.builder import EngineOptions
    from trtopt.plan import Plan
    from trtopt.quant import QuantConfig

log = logging.getLogger(__name__)

# Triton's TensorRT backend loads the serialised engine as model.plan (platform tensorrt_plan; Triton's model
# configuration and model repository guides, triton-inference-server/server docs/user_guide/); TensorRT has no
# 64-bit floats nor unsigned types other than uint8 (the "Datatypes" table there).
TRITON_TENSORRT = TritonModel(
    name="tensorrt",
    key="platform",
    value="tensorrt_plan",
    file="model.plan",
    section="engine",
    dtypes=frozenset({"bool", "uint8", "int8", "int32", "int64", "float16", "float32", "bfloat16"}),
    threads_parameter=None,
)


@dataclass(frozen=True)
class ProfilesReport:
    """The optimisation profiles a plan was built with (this backend's part of the build summary)."""

    key: ClassVar[str] = "tensorrt_profiles"
    profiles: Mapping[str, Profile]

    def to_dict(self) -> dict[str, Any]:
        return {name: {"min": list(p.min), "opt": list(p.opt), "max": list(p.max)} for name, p in self.profiles.items()}

    def rows(self) -> list[tuple[str, str]]:
        shapes = "; ".join(f"{name} {list(p.min)} .. {list(p.max)} (tuned for {list(p.opt)})"
                           for name, p in self.profiles.items())  # fmt: skip
        return [("TensorRT profiles", shapes)]


class TensorRTBackend(Backend["EngineOptions"]):
    name = "tensorrt"
    title = "TensorRT"
    options_type = TensorRTOptions
    runner_section = "engine"
    install_hint = "Install TensorRT 11 and CUDA bindings on a machine with an NVIDIA GPU: pip install 'trtopt[gpu]'."
    auto_rank = 0
    auto_reason = "GPU and TensorRT found"
    # TensorRT's tactics accumulate in TF32 or FP16 where the ONNX reference (run by ONNX Runtime on the CPU)
    # computes in FP32, and no TensorRT build has run through trtopt.verify yet: until its tolerance is
    # measured on a GPU, a mismatch is recorded in the plan and logged, not refused (validity errors still are).
    strict_verification = False
    sparsity_note = (
        "TensorRT decides per layer, on the GPU at build time, whether a sparse kernel is faster (Ampere or newer; "
        "its log says which in the line '(Sparsity) TRT inference plan picked sparse implementation for layers', "
        "shown with -v). trtopt cannot see that choice, and no trtopt build has yet run on a GPU: this lists only "
        "the layers whose weights qualify."
    )

    # Served by Triton's TensorRT backend, instances on every GPU; an engine takes only its profiles' shapes.
    triton = TritonServing(models=(TRITON_TENSORRT,), default=TRITON_TENSORRT.name, instance_kind="KIND_GPU")
    profiled = True

    def status(self) -> BackendStatus:
        from trtopt.backend.tensorrt import detect

        return detect.status()

    def quant_config(self, quant: QuantConfig, options: EngineOptions | None = None) -> QuantConfig:
        """The TensorRT form: inputs of layers quantised, outputs left to TensorRT's own fusions."""
        leading = False if quant.float_leading_depthwise is None else quant.float_leading_depthwise
        return replace(quant, quantize_outputs=False, float_leading_depthwise=leading)

    def options(self, target: BuildTarget, graph: gs.Graph) -> EngineOptions:
        """The user's TensorRT options, FP16 from the build config, and one optimisation profile per dynamic
        input from the graph, --shapes and --batch (checked here, before calibration)."""
        from trtopt.backend.tensorrt.builder import EngineOptions, profiles_for

        _refuse_ml_ops(graph)
        options = target.options_for(TensorRTOptions)
        if target.int8 and not target.fp16 and any(t.dtype == np.float16 for t in [*graph.inputs, *graph.outputs]):
            log.warning("the model takes or gives float16, and INT8 calibrates a float32 copy of it "
                        "(trtopt.frontend.float_types): the layers left float run in FP32 on TensorRT; add --fp16 to "
                        "run them in FP16 as the model did")  # fmt: skip
        return EngineOptions(
            profiles=profiles_for(graph.inputs, target.shapes, options.batch) or None,
            workspace_mib=options.workspace_mib,
            timing_cache=options.timing_cache,
            optimization_level=options.optimization_level,
            sparsity=options.sparsity or target.sparsity,  # --sparsity: SPARSE_WEIGHTS
            fp16=target.fp16,  # written into the graph by the builder (trtopt.precision.convert_to_fp16)
            threads=options.threads,
        )

    def build(self, model: onnx.ModelProto, options: EngineOptions) -> tuple[Sections, Versions]:
        from trtopt.backend.tensorrt import builder

        return builder.build(model, options)

    def profiles(self, options: EngineOptions) -> Mapping[str, Profile] | None:
        return options.profiles

    def report(self, plan: Plan, options: EngineOptions) -> ProfilesReport | None:
        return ProfilesReport(dict(options.profiles)) if options.profiles else None

    def triton_notes(self, plan: Plan, model: TritonModel) -> list[str]:
        if model.section != self.runner_section:
            return []
        version = plan.versions.get("tensorrt", "unknown")
        return [
            f"{model.file} is a TensorRT {version} engine: serve it with a Triton release built on the same TensorRT "
            "version, on the GPU model it was built for."
        ]

    def create_runner(self, plan: Plan, options: RunOptions) -> Runner:
        from trtopt.backend.tensorrt import runner

        return runner.create_runner(plan, options)

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--batch", type=int, help="largest batch for dynamic-batch plans (TensorRT profile; default 1)"
        )
        group.add_argument("--workspace", type=int, default=None, help="TensorRT workspace limit in MiB")
        group.add_argument("--timing-cache", type=Path, help="TensorRT timing cache file to reuse and update")
        group.add_argument("--opt-level", type=int, default=None, help="TensorRT builder optimisation level 0-5")

    def options_from_args(self, args: argparse.Namespace) -> TensorRTOptions:
        return TensorRTOptions(
            batch=args.batch,
            workspace_mib=args.workspace,
            timing_cache=args.timing_cache,
            optimization_level=args.opt_level,
        )


BACKENDS.add(TensorRTBackend.name, TensorRTBackend())


def _refuse_ml_ops(graph: gs.Graph) -> None:
    """ONNX's classical-ML ops (domain ai.onnx.ml: Scaler, ArrayFeatureExtractor, tree ensembles, as skl2onnx
    writes them) have no TensorRT layer, and its ONNX parser would refuse them after calibration: say so first."""
    from trtopt.errors import ModelError
    from trtopt.frontend.loader import ML_DOMAIN

    found = [n for n in graph.nodes if n.domain == ML_DOMAIN]
    if found:
        names = ", ".join(f"{n.name} ({n.op})" for n in found[:4]) + (" ..." if len(found) > 4 else "")
        raise ModelError(
            f"The model has {len(found)} op(s) of ONNX's classical-ML domain {ML_DOMAIN!r} ({names}); TensorRT has "
            "no layers for them.",
            fix="Build it for ONNX Runtime (--backend cpu), which runs them, or convert the network without its "
            "classical-ML pre- and post-processing.",
        )
