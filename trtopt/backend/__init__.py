"""Backends turn a quantised ONNX graph into plan sections (build) and run a plan (runner).

Each backend is one registered object (`BACKENDS`; the contract is `trtopt.backend.base.Backend`) with the
same file roles, so `ls trtopt/backend/*` shows the architecture: ``backend.py`` (the registered object:
status, quantisation defaults, options, variants, verification policy, report), ``builder.py`` (ONNX ->
plan sections) and ``runner.py`` (plan -> outputs); TensorRT adds ``detect.py``. Heavy libraries load
lazily: the CPU backend needs ONNX Runtime, the TensorRT one `tensorrt` and `cuda-bindings`
(``pip install trtopt[gpu]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtopt.backend.base import (
    Backend,
    BackendOptions,
    BackendReport,
    BackendStatus,
    Profile,
    Runner,
    RunOptions,
    Shape,
    TritonModel,
    TritonServing,
)
from trtopt.errors import BackendUnavailableError, UnknownNameError
from trtopt.registry import Registry

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

    from trtopt.plan import Plan

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendOptions",
    "BackendReport",
    "BackendStatus",
    "Profile",
    "RunOptions",
    "Runner",
    "Shape",
    "TritonModel",
    "TritonServing",
    "create_runner",
    "get_backend",
    "quantizable_tensors",
    "select_backend",
]

BACKENDS: Registry[Backend[Any]] = Registry("backend")


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
