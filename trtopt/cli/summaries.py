"""Closing summaries the CLI prints (tables) or emits (`--json`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from trtopt.cli.console import out

if TYPE_CHECKING:
    from trtopt.backend import BackendReport
    from trtopt.build import BuildResult


def build_summary(result: BuildResult, path: Path) -> dict[str, Any]:
    meta = result.plan.metadata
    quant = meta.quant
    summary: dict[str, Any] = {
        "plan": str(path),
        "backend": result.plan.backend,
        "precision": meta.precision,
        "file_bytes": path.stat().st_size,
        "stage_seconds": result.stage_seconds,
        "int8_layers": len(quant.int8_layers) if quant else 0,
        "bias_corrected_layers": len(quant.bias_corrected_layers) if quant else 0,
        "float_layers": quant.float_layers if quant else {},
        "calibration": quant.to_dict()["calibration"] if quant else None,
        "sensitivity": quant.sensitivity if quant else None,
        "equalization": result.equalization,
        "seven_bit_weights": meta.extra.get("seven_bit_weights") if quant else None,  # trtopt.search.seven_bit
        "not_measured": meta.extra.get("not_measured") if quant else None,  # searches a cache-only build skipped
        "optimizer": meta.optimizer.to_dict() if meta.optimizer else None,
        "graph_check": result.graph_check.to_dict() if result.graph_check else None,
        "preprocess": meta.preprocess,  # what `trtopt run` will do to images (None: the plan takes arrays)
    }
    for report in (result.report, result.speed):
        if report is not None:
            summary[report.key] = report.to_dict()
    if result.verification is not None:
        summary["verification"] = result.verification.to_dict()
        if quant is None:  # no INT8 from this build: the reference is the FP16 model, or the model as given
            fallback = result.speed is not None  # timed as INT8, written float: the speed row says why
            summary["verification"]["reference"] = ("FP16" if "fp16" in (meta.precision or "")
                                                    else FLOAT_FALLBACK if fallback else AS_GIVEN)  # fmt: skip
        if result.verification.warnings:
            summary["warnings"] = result.verification.warnings
    if quant is not None and not quant.int8_layers:
        summary["warnings"] = [no_int8_warning(quant.float_layers), *summary.get("warnings", [])]
    if meta.get("sparsity"):
        summary["sparsity"] = meta["sparsity"]
    return summary


def print_build_summary(
    summary: dict[str, Any], backend_reason: str, report: BackendReport | None = None,
    speed: BackendReport | None = None,
) -> None:  # fmt: skip
    """The summary as a table; `report` adds what the backend made of the plan (`BuildResult.report`), `speed`
    its time against FP32's (`BuildResult.speed`)."""
    table = Table(title=f"built {summary['plan']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("backend", backend_reason)
    table.add_row("precision", str(summary["precision"]))
    table.add_row("plan size", f"{summary['file_bytes'] / 2**20:.2f} MiB")
    if summary.get("preprocess"):
        source = f" ({summary['preprocess_source']})" if summary.get("preprocess_source") else ""
        table.add_row("preprocessing", preprocess_text(summary["preprocess"]) + source)
    if summary.get("calibration"):
        cal = summary["calibration"]
        methods = cal.get("methods") or {}
        varied = len(methods) > 1 or (methods and next(iter(methods)) != cal["method"])  # auto: max everywhere too
        per_method = f" (thresholds: {', '.join(f'{m} {n}' for m, n in methods.items())})" if varied else ""
        from trtopt.calib.auto import SCORE_SAMPLES

        scored = (f" for the histograms, and up to {SCORE_SAMPLES} more held back to score the candidates"
                  if cal["method"] == "auto" else "")  # the verification's count of calibration samples holds them
        table.add_row("calibration", f"{cal['method']} on {cal['samples']} samples{scored}{per_method}")
    if summary.get("equalization"):
        table.add_row("equalisation", summary["equalization"])
    table.add_row("INT8 layers", f"{summary['int8_layers']} ({summary['bias_corrected_layers']} bias-corrected)")
    if seven := summary.get("seven_bit_weights"):
        table.add_row("7-bit weights", f"{len(seven['layers'])} of {seven['candidates']} dense layers (exact on u8s8 "
                      f"kernels here; {seven['added_error']:.2f}x the 8-bit plan's error added, in squares)")
    floats = summary["float_layers"]
    if floats:
        table.add_row("float layers", float_reasons(floats))
    row = sensitivity_row(summary.get("sensitivity"))
    if row is not None:
        table.add_row(*row)
    if skipped := summary.get("not_measured"):
        table.add_row("not measured", not_measured_text(skipped))
    for label, text in report.rows() if report is not None else []:
        table.add_row(label, text)
    if summary.get("graph_check"):  # the optimised graph against the model file (trtopt.passes.check)
        table.add_row("graph", f"optimised graph {summary['graph_check']['note']}")
    verification = summary.get("verification")
    if verification:
        table.add_row("verified", verification_text(verification))
    for label, text in speed.rows() if speed is not None else []:
        table.add_row(label, text)
    if summary.get("sparsity"):
        table.add_row("2:4 sparsity", sparsity_text(summary["sparsity"]))
    for warning in summary.get("warnings", []):
        table.add_row(Text("WARNING", style="bold red"), Text(warning, style="bold red"))
    times = summary["stage_seconds"]
    table.add_row(
        "time", ", ".join(f"{k} {v:.2f}s" for k, v in times.items()) + f" (total {sum(times.values()):.2f}s)"
    )
    out.print(table)


# A build without --int8 (or --fp16) changes no precision: its reference is the model it was given (a float model,
# or one another tool quantised already, Q/DQ included), which is also what "FP32" ran, so reference vs FP32
# compares the model with itself and always reads 1.0. The summary says that instead of an INT8 figure nobody
# measured. (With --fp16 alone the reference is the FP16 graph, a real figure, labelled as such.)
AS_GIVEN = "the model as given (built without --int8)"
FLOAT_FALLBACK = "the model as given (the float plan, written instead of the INT8 plan: see speed)"


def preprocess_text(record: dict[str, Any]) -> str:
    """The images' preprocessing in one line, as the plan stores it ("resize 256 (shorter side), centre crop
    224x224, bilinear, RGB, / 255, mean 0.485 0.456 0.406, std 0.229 0.224 0.225, NCHW float32")."""
    from trtopt.data.preprocess import PreprocessSpec

    spec = PreprocessSpec.from_dict(record, where="the plan's preprocessing")
    (h, w), numbers = spec.crop_hw, lambda values: " ".join(f"{v:g}" for v in values)
    size = {"shorter": f"resize {spec.resize_short} (shorter side), centre crop {h}x{w}",
            "stretch": f"resize to {h}x{w} (stretched)",
            "letterbox": f"letterbox to {h}x{w} (pad {spec.pad_value:g}, {spec.pad_align})"}[spec.resize_mode]
    return (f"{size}, {spec.interpolation}, {spec.color}, / {spec.scale:g}, mean {numbers(spec.mean)}, "
            f"std {numbers(spec.std)}, {spec.layout} {spec.dtype}")


def no_int8_warning(floats: dict[str, str]) -> str:
    """The warning for an --int8 build that quantised no layer (basic-pitch's note transcriber: all 23 convs have
    fewer than 16 channels, one of them with 65% of the multiply-adds): the plan is a float plan."""
    few = any(why.startswith("fewer than") for why in floats.values())
    fix = (" --min-channels 1 quantises layers with few channels too (a smaller speed-up and maybe more error on "
           "those: check with `trtopt compare`)." if few else "")
    what = (f"the {len(floats)} layers that could be INT8 all stay float, by reason: {float_reasons(floats)}" if floats
            else "the model has no layer INT8 could run (a Conv, Gemm or MatMul with weights)")
    return f"--int8 quantised no layer: {what}. This plan computes in float and is no faster than FP32.{fix}"


def float_reasons(floats: dict[str, str]) -> str:
    """Layers kept float, counted by reason ("2 (fewer than 16 channels), 5 (kept float by sensitivity
    analysis)"); the search's reasons differ per layer, and its own row (`sensitivity_row`) gives them."""
    from trtopt.search import REASON

    reasons: dict[str, int] = {}
    for why in floats.values():
        why = REASON if why.startswith(REASON) else why
        reasons[why] = reasons.get(why, 0) + 1
    return ", ".join(f"{n} ({why})" for why, n in reasons.items())


def not_measured_text(searches: list[str]) -> str:
    """Why a build from a calibration cache alone skipped the searches that measure fidelity, what the plan holds
    instead, and how to run them (`trtopt.quantize._not_measured`)."""
    effects = {"sensitivity analysis": "every layer the rules allow is INT8",
               "7-bit weight search": "dense layers keep 8-bit weights (u8u8 kernels: exact, slower without VNNI)"}
    held = "; ".join(effects.get(name, name) for name in searches)
    return (f"{' and '.join(searches)}: they measure fidelity on calibration data and this build had only a cache, "
            f"so {held}. Pass --calib DIR beside --calib-cache to run them (the cache's thresholds are kept)")


def sensitivity_row(record: dict[str, Any] | None) -> tuple[str, str] | None:
    """What the sensitivity search did (`trtopt.search.sensitivity`), when it ran: the layers it kept float,
    and whether the plan falls short of its aim on calibration samples, with what to do then (None when the
    plan met the aim at once, or no search ran)."""
    from trtopt.search import MIN_COSINE

    if not record:
        return None
    after, confirmed = float(record["after"]), record.get("confirmed")
    layers, wider = record.get("layers") or {}, record.get("thresholds") or {}
    short = min(after, float(confirmed["after"]) if confirmed else after) < MIN_COSINE
    if not layers and not wider and not short:
        return None
    moves = [f"{tensor}'s threshold {move['from']:.4g} -> {move['to']:.4g}" for tensor, move in wider.items()]
    text = (f"{', '.join([*layers, *moves])}: worst output score on calibration samples {record['before']:.4f} -> "
            f"{after:.4f}" if layers or moves else
            f"no layer kept float lifts the worst output score on calibration samples ({after:.4f})")  # fmt: skip
    if confirmed:
        text += f" ({confirmed['before']:.4f} -> {confirmed['after']:.4f} on the confirmation samples)"
    text += f", {record['trials']} trial builds (an output's score: its cosine, or its top-class agreement or mean " \
            "IoU where lower)"
    top = record.get("ceiling") or {}
    if top.get("hopeless"):  # the search stopped at its first test (trtopt.search._ceiling)
        return "sensitivity analysis", (
            f"{text}; stopped there, short of the {MIN_COSINE} aim: with the {top['layers']} layers adding the most "
            f"error kept float at once the worst output score is only {top['worst']:.4f}, so no few layers kept "
            "float can mend it: calibrate on more samples like the model's real inputs (--calib), or keep the "
            "part of the model INT8 harms float by hand (--exclude; `trtopt compare --per-layer`)")  # fmt: skip
    if short:
        text += (f"; still short of the {MIN_COSINE} aim: calibrate on more samples like the model's real inputs "
                 "(--calib), or keep more layers float by hand (--exclude; `trtopt compare --per-layer` names "
                 "those adding the most error)")
    return ("kept float by sensitivity" if layers and not moves else "sensitivity analysis"), text


def verification_text(record: dict[str, Any]) -> str:
    """The build's self-check in a few lines: what quantisation costs, and whether the kernels compute it."""
    from trtopt.plan.verification import Verification

    v = Verification.from_dict(record)
    float_plan = record.get("reference") in (AS_GIVEN, FLOAT_FALLBACK)
    cost = (
        f"reference: {record['reference']}; the plan quantises nothing, so there is no INT8-vs-FP32 figure"
        if float_plan
        else f"{record.get('reference', 'INT8')} reference vs FP32: {v.reference_vs_fp32.describe(worst_sample=True)}"
    )
    variant = "" if float_plan else f" ({v.variant})"  # no INT8 encoding to name
    lines = [
        f"on {v.samples} samples ({v.source}), {v.isa} CPU",
        cost,
        f"kernels{variant} vs reference: {v.kernels_vs_reference.describe()} "
        f"({'within' if v.ok else 'OVER'} tolerance {v.tolerance:.3g})",
    ]
    lines += [f"rejected {r['variant']}: relative error {r['rel_error']:.3g}" for r in v.rejected]
    lines += [f"outputs {v.judged}"] if v.judged else []
    return "\n".join(lines)


def sparsity_text(record: dict[str, Any], shown: int = 6) -> str:
    """`build --sparsity`: the layers whose weights qualify for TensorRT's sparse kernels, and what is unknown."""
    layers = record["qualifying_layers"]
    names = ", ".join(layers[:shown]) + (f" and {len(layers) - shown} more" if len(layers) > shown else "")
    lines = [
        f"{len(layers)} layers qualify ({record['qualifying_mac_share']:.1%} of MACs): 2:4 weights, INT8 or FP16"
        + (f": {names}" if layers else "")
    ]
    if record["fp32_layers_with_2_4_weights"]:
        lines.append(f"{len(record['fp32_layers_with_2_4_weights'])} more have 2:4 weights but run FP32")
    if record["eligible_not_2_4"]:
        lines.append(
            f"{len(record['eligible_not_2_4'])} eligible layers are not 2:4 (`trtopt sparsify` prunes them; "
            f"eligible: {record['eligible_mac_share']:.1%} of MACs)"
        )
    return "\n".join([*lines, record["note"]])
