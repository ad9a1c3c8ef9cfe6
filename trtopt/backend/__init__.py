"""Backends turn a quantised ONNX graph into plan sections (build) and run a plan (runner).

Each backend is one registered object (`BACKENDS`; the contract is `trtopt.backend.base.Backend`) with the
same file roles, so `ls trtopt/backend/*` shows the architecture: ``backend.py`` (the registered object:
status, quantisation defaults, options, variants, verification policy, report), ``builder.py`` (ONNX ->
plan sections) and ``runner.py`` (plan -> outputs); TensorRT adds ``detect.py``. Heavy libraries load
lazily: the CPU backend needs ONNX Runtime, the OpenVINO one `openvino` (``pip install trtopt[openvino]``), the
TensorRT one `tensorrt` and `cuda-bindings` (``pip install trtopt[gpu]``).

A backend is told a `BuildTarget` (INT8, FP16, sparsity, fixed shapes, its own options), never the build's
config; it registers itself into `registry.BACKENDS`, which imports only `base`, and this package imports each
backend module once so that the registry lists them all (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trtopt.backend.base import (
    Backend,
    BackendOptions,
    BackendReport,
    BackendStatus,
    BuildTarget,
    Profile,
    Runner,
    RunOptions,
    Shape,
    TritonModel,
    TritonServing,
)
from trtopt.backend.registry import BACKENDS
from trtopt.errors import BackendUnavailableError, PlanError, TrtoptError, UnknownNameError

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

    from trtopt.plan import Plan

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendOptions",
    "BackendReport",
    "BackendStatus",
    "BuildTarget",
    "Profile",
    "RunOptions",
    "Runner",
    "Shape",
    "TritonModel",
    "TritonServing",
    "check_runner_section",
    "checked_backend_options",
    "create_runner",
    "get_backend",
    "prequantized_keeps",
    "quantizable_tensors",
    "select_backend",
]


def get_backend(name: str) -> Backend[Any]:
    """The registered backend called `name`; an unknown name lists the valid ones (and `auto`)."""
    if name not in BACKENDS:
        raise UnknownNameError("backend", name, ["auto", *BACKENDS])
    return BACKENDS.get(name)


def select_backend(name: str = "auto") -> tuple[Backend[Any], str]:
    """The backend to build with, and why: `name` if it is available here, or for `auto` the available
    backend of lowest `auto_rank` (TensorRT where a GPU and TensorRT answer, else the CPU)."""
    if name != "auto":
        backend = get_backend(name)
        status = backend.status()
        if not status.available:
            raise BackendUnavailableError(
                f"Backend {name!r} is not available here: {status.reason}", fix=backend.install_hint
            )
        return backend, f"{name} (asked for)"
    skipped: list[tuple[Backend[Any], str]] = []
    for backend in sorted((BACKENDS.get(n) for n in BACKENDS), key=lambda b: b.auto_rank):
        status = backend.status()
        if status.available:
            why = "; ".join(f"{b.title} not used: {reason}" for b, reason in skipped) or backend.auto_reason
            return backend, f"{backend.name} ({why})"
        skipped.append((backend, status.reason))
    raise BackendUnavailableError("No backend is available here: " + "; ".join(f"{b.name}: {r}" for b, r in skipped))


def checked_backend_options(options: BackendOptions | Sequence[BackendOptions]) -> tuple[BackendOptions, ...]:
    """`BuildConfig.backend_options`: at most one options object per registered backend."""
    given = (options,) if isinstance(options, BackendOptions) else tuple(options)
    seen: set[str] = set()
    for item in given:
        if not isinstance(item, BackendOptions):
            raise TrtoptError(
                f"BuildConfig.backend_options holds {item!r}; expected backend options such as the "
                "`options_type` of a backend in trtopt.backend.BACKENDS.",
                fix="Pass each backend's own options class (its `options_type`), at most one per backend.",
            )
        get_backend(item.backend)
        if item.backend in seen:
            raise TrtoptError(f"BuildConfig.backend_options has two entries for the {item.backend!r} backend.",
                              fix="Give each backend's options once.")  # fmt: skip
        seen.add(item.backend)
    return given


def prequantized_keeps() -> list[str]:
    """What each backend keeps of a model another tool quantised, for the front end's advice
    (`trtopt.frontend.prequantized.refuse_prequantized`)."""
    return [f"the {b.title} backend takes {b.prequantized_keeps}" for b in map(BACKENDS.get, BACKENDS)
            if b.prequantized_keeps]  # fmt: skip


def check_runner_section(plan: Plan) -> None:
    """Refuse a plan without the section its backend's runner reads (`Backend.runner_section`). The plan format is
    read below the backends, so this check of a plan's contents stands here, and `trtopt.Engine` makes it on load."""
    backend = get_backend(plan.backend)
    if backend.runner_section not in plan.sections:
        raise PlanError(
            f"This plan is damaged: a {plan.backend} plan needs an {backend.runner_section!r} section, found "
            f"{sorted(plan.sections)}.",
            fix="Rebuild the plan with `trtopt build`; a plan file is written whole or not at all.",
        )


def create_runner(plan: Plan, options: RunOptions) -> Runner:
    """A runner for `plan` on the backend it was built for, or a clear error where that backend is missing."""
    backend = get_backend(plan.backend)
    status = backend.status()
    if not status.available:
        raise BackendUnavailableError(
            f"This plan was built for the {plan.backend!r} backend, which is not available here: {status.reason}",
            fix=backend.install_hint + " Or build a CPU plan with `trtopt build ... --backend cpu`.",
        )
    return backend.create_runner(plan, options)


def quantizable_tensors(graph: gs.Graph) -> list[str]:
    """Every tensor any registered backend may quantise in `graph`, whatever the user's --exclude or
    --min-channels: what a calibration cache must cover to serve every build of this graph."""
    from trtopt.quant import QuantConfig, plan_quantization

    widest = QuantConfig(min_channels=1, float_leading_depthwise=False)
    config = QuantConfig.covering([BACKENDS.get(n).quant_config(widest) for n in BACKENDS])
    return plan_quantization(graph, config).activation_tensors


# Register the backends (their modules import nothing heavy); `trtopt build --help` lists them in this order.
from trtopt.backend.cpu import backend as _cpu  # noqa: E402, F401
from trtopt.backend.openvino import backend as _openvino  # noqa: E402, F401
from trtopt.backend.tensorrt import backend as _tensorrt  # noqa: E402, F401
