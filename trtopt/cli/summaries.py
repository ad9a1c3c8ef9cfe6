"""Closing summaries the CLI prints (tables) or emits (`--json`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from trtopt.cli.console import out


def build_summary(result: Any, path: Path) -> dict[str, Any]:
    meta = result.plan.metadata
    int8 = meta.get("int8_layers") or []
    floats = meta.get("float_layers") or {}
    summary: dict[str, Any] = {
        "plan": str(path),
        "backend": result.plan.backend,
        "precision": meta.get("precision"),
        "file_bytes": path.stat().st_size,
        "stage_seconds": result.stage_seconds,
        "int8_layers": len(int8),
        "bias_corrected_layers": len(meta.get("bias_corrected_layers") or []),
        "float_layers": floats,
        "calibration": meta.get("calibration"),
        "sensitivity": meta.get("sensitivity"),
        "optimizer": meta.get("optimizer"),
    }
    if result.kernels is not None:
        summary["onnxruntime_kernels"] = {
            "int8_convs": result.kernels.int8_convs,
            "float_convs": result.kernels.float_convs,
            "int8_matmuls": result.kernels.int8_matmuls,
            "gemm_convs": result.kernels.gemm_convs,
        }
    if result.verification is not None:
        summary["verification"] = result.verification.to_dict()
    return summary


def print_build_summary(summary: dict[str, Any], backend_reason: str) -> None:
    table = Table(title=f"built {summary['plan']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("backend", backend_reason)
    table.add_row("precision", str(summary["precision"]))
    table.add_row("plan size", f"{summary['file_bytes'] / 2**20:.2f} MiB")
    if summary.get("calibration"):
        cal = summary["calibration"]
        methods = cal.get("methods") or {}
        per_method = f" (thresholds: {', '.join(f'{m} {n}' for m, n in methods.items())})" if len(methods) > 1 else ""
        table.add_row("calibration", f"{cal['method']} on {cal['samples']} samples{per_method}")
    table.add_row("INT8 layers", f"{summary['int8_layers']} ({summary['bias_corrected_layers']} bias-corrected)")
    floats = summary["float_layers"]
    if floats:
        reasons: dict[str, int] = {}
        for why in floats.values():
            reasons[why] = reasons.get(why, 0) + 1
        table.add_row("float layers", ", ".join(f"{n} ({why})" for why, n in reasons.items()))
    sensitivity = summary.get("sensitivity")
    if sensitivity and sensitivity.get("layers"):
        table.add_row(
            "kept float by sensitivity",
            f"{', '.join(sensitivity['layers'])}: worst output cosine on calibration samples "
            f"{sensitivity['before']:.4f} -> {sensitivity['after']:.4f} ({sensitivity['trials']} trial builds)",
        )
    kernels = summary.get("onnxruntime_kernels")
    if kernels:
        table.add_row(
            "ONNX Runtime kernels",
            f"{kernels['int8_convs']} INT8 convs"
            + (f" ({kernels['gemm_convs']} on the GEMM/AMX kernel)" if kernels.get("gemm_convs") else "")
            + f", {kernels['float_convs']} float convs, {kernels['int8_matmuls']} INT8 matmuls",
        )
    verification = summary.get("verification")
    if verification:
        table.add_row("verified", verification_text(verification))
    times = summary["stage_seconds"]
    table.add_row(
        "time", ", ".join(f"{k} {v:.2f}s" for k, v in times.items()) + f" (total {sum(times.values()):.2f}s)"
    )
    out.print(table)


def verification_text(record: dict[str, Any]) -> str:
    """The build's self-check in a few lines: what quantisation costs, and whether the kernels compute it."""
    from trtopt.verify import Verification

    v = Verification.from_dict(record)
    lines = [
        f"on {v.samples} samples ({v.source}), {v.isa} CPU",
        f"INT8 reference vs FP32: {v.reference_vs_fp32.describe()}",
        f"kernels ({v.variant}) vs reference: {v.kernels_vs_reference.describe()} "
        f"({'within' if v.ok else 'OVER'} tolerance {v.tolerance:.3g})",
    ]
    lines += [f"rejected {r['variant']}: relative error {r['rel_error']:.3g}" for r in v.rejected]
    return "\n".join(lines)
