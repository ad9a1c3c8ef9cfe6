#!/usr/bin/env python3
"""INT8 accuracy on real photos: trtopt's CPU plans (one per calibration method) and ONNX Runtime's own
quantize_static, each against the FP32 model run by ONNX Runtime.

    python tools/bench_accuracy.py [--model models/efficientnet_lite0.onnx | --model tiny_cnn]
        [--calib calib_data] [--heldout tests/data/heldout tests/data/heldout_more] [--count N] [--eval-count N]
        [--methods auto entropy max percentile mse] [--ort entropy minmax] [--out FILE.md] [--plot FILE.png]

Every variant calibrates on the same images (--calib, the first --count), preprocessed as `trtopt build`
does for the model (its sidecar JSON for the demo model). Held-out photos (--heldout) are never used for
calibration; the held-out agreement comes with a 95% Wilson interval and is also given per folder, and a
second, in-sample column adds the calibration photos. Labelled accuracy uses each held-out folder's
labels.json (file -> acceptable ImageNet class indices; photos it does not list are unlabelled) for
1000-class models. ORT's variants: quant_pre_process (ORT's recommended first step; --ort-raw rows skip
it), then quantize_static with QDQ, per-channel QInt8 weights, QUInt8 activations, default calibrator
settings. Build time is wall time: trtopt's whole build_plan, or the quantize_static call,
both including image decoding; each build runs in a fresh process whose peak RSS is reported.
Kernels: what ONNX Runtime's optimised graph of the quantised model runs (INT8 / float conv kernels,
QuantizeLinear + DequantizeLinear nodes left as float<->int8 conversions, Pads left in float).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_setup import (  # noqa: E402
    CALIB_DIR,
    DEMO_MODEL,
    HELDOUT_DIR,
    HELDOUT_MORE_DIR,
    ORT_METHODS,
    Kernels,
    ModelUnderTest,
    even_batch,
    image_dataset,
    kernel_counts,
    ort_build,
    resolve_model,
    run_isolated,
    stacked,
    trtopt_build,
)
from benchlib import bar_chart, emit, header_lines, load_average  # noqa: E402

from trtopt.calib import METHODS  # noqa: E402
from trtopt.calib.config import DEFAULT_METHOD  # noqa: E402
from trtopt.execution.ort_session import OrtSession  # noqa: E402

IMAGENET_CLASSES = 1000


@dataclass
class Variant:
    name: str
    build_s: float | None
    peak_gib: float | None  # peak RSS of the process that built it
    runner: OrtSession  # the model on ONNX Runtime's kernels, as it runs
    kernels: Kernels | None = None
    reference: OrtSession | None = None  # the same Q/DQ model as float math: what it means


@dataclass(frozen=True)
class Scores:
    agree_heldout: float
    agree_per_set: tuple[float, ...]
    agree_all: float
    cosine_heldout: float
    cosine_min: float
    top1: float | None
    top5: float | None


def build_variant(model: ModelUnderTest, kind: str, method: str, args: argparse.Namespace) -> Variant:
    """Build one INT8 variant in its own process (for its own peak memory) and open it in ONNX Runtime, as it
    runs (kernels) and as float math (reference). `kind`: "trtopt" (the plan as `Engine` runs it here),
    "trtopt-u8s8" (the u8s8 encoding forced and run as stored: the VNNI plan on this CPU), "trtopt-u8u8" (8-bit
    weights everywhere, the default on CPUs without VNNI before the u8s7 encoding's 7-bit weights), "ort"
    (quant_pre_process + quantize_static), "ort-rr" (the same with reduce_range) or "ort-raw" (no pre-process)."""
    from trtopt.backend.cpu.runner import model_for_this_cpu
    from trtopt.plan import Plan

    data = (model, str(args.calib), args.count, method)
    if kind.startswith("trtopt"):
        forced, encoding = kind == "trtopt-u8s8", kind.removeprefix("trtopt-") if "-" in kind else "auto"
        (seconds, model_bytes), peak_gib = run_isolated(trtopt_build, *data, encoding)
        name = f"trtopt {method}" + (" (default)" if method == DEFAULT_METHOD and encoding == "auto" else "")
        name += {"u8s8": ", u8s8 forced, run as stored", "u8u8": ", u8u8 (8-bit weights)"}.get(encoding, "")
        executed = model_bytes if forced else model_for_this_cpu(Plan("cpu", (), (), {"onnx": model_bytes}))
    else:
        name = f"ORT QDQ {method}" + {"ort": "", "ort-rr": ", reduce_range", "ort-raw": ", no pre-process"}[kind]
        (seconds, executed), peak_gib = run_isolated(ort_build, *data, kind != "ort-raw", kind == "ort-rr")
    runner = OrtSession(onnx.load_from_string(executed))
    reference = OrtSession(onnx.load_from_string(executed), opt_level="disable")
    return Variant(name, seconds, peak_gib, runner, kernel_counts(executed), reference)


def logits(runner: OrtSession, images: np.ndarray, batch: int) -> np.ndarray:
    name = runner.input_names[0]
    out = [runner.run({name: images[i : i + batch]})[runner.output_names[0]] for i in range(0, len(images), batch)]
    return np.concatenate(out).reshape(len(images), -1)


def score(ref: np.ndarray, test: np.ndarray, sets: list[int], labels: list[list[int] | None]) -> Scores:
    """ref/test: [n, classes] logits; the first sum(`sets`) rows are held-out photos (one count per folder,
    in order), `labels` theirs."""
    heldout = sum(sets)
    agree = ref.argmax(1) == test.argmax(1)
    ref, test = ref.astype(np.float64), test.astype(np.float64)
    cos = (ref * test).sum(1) / np.maximum(np.linalg.norm(ref, axis=1) * np.linalg.norm(test, axis=1), 1e-30)
    top1 = top5 = None
    labelled = [(row, lab) for row, lab in enumerate(labels) if lab]
    if labelled:
        order = np.argsort(-test[:heldout], axis=1)[:, :5]
        top1 = float(np.mean([order[r, 0] in lab for r, lab in labelled]))
        top5 = float(np.mean([bool(set(order[r]) & set(lab)) for r, lab in labelled]))
    bounds = np.cumsum([0, *sets])
    return Scores(
        float(agree[:heldout].mean()),
        tuple(float(agree[a:b].mean()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)),
        float(agree.mean()),
        float(cos[:heldout].mean()),
        float(cos[:heldout].min()),
        top1,
        top5,
    )


def wilson(share: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion observed as `share` of `n` (Wilson 1927)."""
    if n == 0:
        return 0.0, 1.0
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def heldout_labels(model: ModelUnderTest, heldout: Path, sources: list[str]) -> list[list[int] | None]:
    """Acceptable classes per held-out row (None: unlabelled), for ImageNet classifiers only."""
    path = heldout / "labels.json"
    if model.num_classes != IMAGENET_CLASSES or not path.is_file():
        return [None] * len(sources)
    table = json.loads(path.read_text())
    return [table.get(Path(s).name) for s in sources]


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def table(variants: list[Variant], scores: list[Scores], counts: dict[str, int]) -> list[str]:
    n_labelled = counts["labelled"]
    rows = [
        f"| variant | top-1 agree, held-out ({counts['heldout']}), 95% CI "
        f"| top-1 agree, in-sample ({counts['all']}) | mean cosine (held-out) | min cosine "
        f"| labelled top-1 ({n_labelled}) | labelled top-5 ({n_labelled}) | build time / peak RSS "
        "| INT8 convs | float convs | Q/DQ left | float Pads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v, s in zip(variants, scores, strict=True):
        build = "–" if v.build_s is None else f"{v.build_s:.1f} s" if v.build_s >= 1 else f"{v.build_s:.2f} s"
        build += "" if v.peak_gib is None else f" / {v.peak_gib:.2f} GiB"
        k = v.kernels
        kernels = "| – " * 4 if k is None else f"| {k.int8_convs} | {k.float_convs} | {k.conversions} | {k.float_pads} "
        rows.append(
            f"| {v.name} | {pct(s.agree_heldout)} ({_interval(s.agree_heldout, counts['heldout'])}) "
            f"| {pct(s.agree_all)} | {s.cosine_heldout:.4f} "
            f"| {s.cosine_min:.4f} | {pct(s.top1)} | {pct(s.top5)} | {build} {kernels}|"
        )
    return rows


def _relative_errors(fp32: np.ndarray, kernels: np.ndarray, reference: np.ndarray, n: int) -> tuple[float, float]:
    """(reference vs FP32, kernels vs reference) relative L2 errors over the first n (held-out) rows, as
    trtopt.verify measures them at build time."""
    from trtopt.metrics.agreement import agreement

    quantisation = agreement({"y": reference[:n]}, {"y": fp32[:n]}).rel_error
    return quantisation, agreement({"y": kernels[:n]}, {"y": reference[:n]}).rel_error


def fidelity_table(
    variants: list[Variant],
    scores: list[Scores],
    meant: list[Scores | None],
    errors: list[tuple[float, float] | None],
    n: int,
    total: int,
) -> list[str]:
    """Per variant: what its Q/DQ graph means (reference, float math) and what this CPU's kernels deliver."""
    rows = [
        f"| variant | reference: top-1 agree ({n}) | kernels: top-1 agree ({n}) | kernels − reference "
        f"| kernels − reference, in-sample ({total}) "
        "| reference: mean cosine | kernels: mean cosine | reference vs FP32: rel. error "
        "| kernels vs reference: rel. error (ratio) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v, kernel, ref, err in zip(variants[1:], scores[1:], meant[1:], errors[1:], strict=True):
        if ref is None or err is None:
            continue
        gap = (kernel.agree_heldout - ref.agree_heldout) * 100
        gap_all = (kernel.agree_all - ref.agree_all) * 100
        rows.append(
            f"| {v.name} | {pct(ref.agree_heldout)} | {pct(kernel.agree_heldout)} | **{gap:+.1f} points** "
            f"| {gap_all:+.1f} points | {ref.cosine_heldout:.4f} | {kernel.cosine_heldout:.4f} | {err[0]:.4f} "
            f"| {err[1]:.4f} ({err[1] / max(err[0], 1e-12):.2f}x) |"
        )
    return rows


def _interval(share: float, n: int) -> str:
    low, high = wilson(share, n)
    return f"{low * 100:.1f}-{high * 100:.1f}%"


def per_set_table(variants: list[Variant], scores: list[Scores], sets: list[tuple[str, int]]) -> list[str]:
    rows = [
        "| variant | " + " | ".join(f"`{name}` ({n})" for name, n in sets) + " |",
        "|---|" + "---:|" * len(sets),
    ]
    for v, s in zip(variants[1:], scores[1:], strict=True):
        cells = [f"{pct(a)} ({round(a * n)}/{n})" for a, (_, n) in zip(s.agree_per_set, sets, strict=True)]
        rows.append(f"| {v.name} | " + " | ".join(cells) + " |")
    return rows


def plot(path: Path, variants: list[Variant], scores: list[Scores], counts: dict[str, int]) -> None:
    names = [v.name.replace(", ", ",\n").replace(" QDQ ", " QDQ\n").replace("trtopt ", "trtopt\n")
             for v in variants[1:]]
    series = {
        f"top-1 agreement, held-out ({counts['heldout']})": [s.agree_heldout for s in scores[1:]],
        f"top-1 agreement, in-sample ({counts['all']})": [s.agree_all for s in scores[1:]],
    }
    if scores[0].top1 is not None:
        series[f"labelled top-1 ({counts['labelled']}); FP32 dashed"] = [s.top1 or 0.0 for s in scores[1:]]
    title = "INT8 vs FP32 on photos: trtopt calibration methods and ORT quantize_static"
    bar_chart(path, names, series, scores[0].top1, title)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEMO_MODEL), help="ONNX file or trtopt.zoo name (e.g. tiny_cnn)")
    parser.add_argument("--calib", type=Path, default=CALIB_DIR, help="calibration images")
    parser.add_argument("--heldout", type=Path, nargs="+", default=[HELDOUT_DIR, HELDOUT_MORE_DIR],
                        help="held-out image folders (each may have a labels.json); default: both shipped sets")
    parser.add_argument("--count", type=int, help="calibration images to use (default: all)")
    parser.add_argument("--eval-count", type=int, help="held-out images to use (default: all)")
    parser.add_argument("--methods", nargs="*", default=[DEFAULT_METHOD, "entropy", "max", "percentile", "mse"],
                        choices=list(METHODS.names()), help="trtopt calibration methods")
    parser.add_argument("--ort", nargs="*", default=["entropy", "minmax"], choices=list(ORT_METHODS),
                        help="ONNX Runtime quantize_static calibration methods (after quant_pre_process)")
    parser.add_argument("--ort-raw", nargs="*", default=["minmax"], choices=list(ORT_METHODS),
                        help="quantize_static methods run on the model as it is (no quant_pre_process)")
    parser.add_argument("--ort-reduce-range", nargs="*", default=["minmax"], choices=list(ORT_METHODS),
                        help="quantize_static methods with reduce_range=True (7-bit weights, ORT's remedy for "
                        "CPUs without VNNI)")
    parser.add_argument("--u8u8", nargs="*", default=[DEFAULT_METHOD], help="trtopt methods also built in u8u8")
    parser.add_argument("--u8s8", nargs="*", default=["entropy"], choices=list(METHODS.names()),
                        help="trtopt methods also built with the u8s8 encoding forced and run as stored (what "
                        "a plan for VNNI CPUs computes on this one)")
    parser.add_argument("--batch", type=int, default=8, help="evaluation batch (models with a dynamic batch)")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    parser.add_argument("--plot", type=Path, help="write a bar chart (PNG) here")
    return parser.parse_args(argv)


@dataclass
class Evaluation:
    """Every variant scored on the held-out and calibration images (what the report tabulates)."""

    model: ModelUnderTest
    variants: list[Variant]
    scores: list[Scores]
    meant: list[Scores | None]  # the scores of what each plan means (its Q/DQ reference)
    errors: list[tuple[float, float] | None]
    sets: list[int]  # held-out images per folder
    counts: dict[str, int]
    calib_count: int


def evaluate(args: argparse.Namespace) -> Evaluation:
    with tempfile.TemporaryDirectory(prefix="bench-accuracy-") as tmp:
        model = resolve_model(args.model, Path(tmp))
        batch = model.static_batch or args.batch
        per_set = [stacked(image_dataset(model, folder, args.eval_count)) for folder in args.heldout]
        heldout_images = np.concatenate([images for images, _ in per_set])
        sets = [len(images) for images, _ in per_set]
        calib_images, _ = stacked(image_dataset(model, args.calib, args.count))
        images = np.concatenate([heldout_images, calib_images])
        labels = [lab for folder, (_, src) in zip(args.heldout, per_set, strict=True)
                  for lab in heldout_labels(model, folder, src)]

        variants = [Variant("FP32 (ONNX Runtime)", None, None, OrtSession(onnx.load(model.path)))]
        variants += [build_variant(model, "trtopt", m, args) for m in args.methods]
        variants += [build_variant(model, "trtopt-u8u8", m, args) for m in args.u8u8]
        variants += [build_variant(model, "trtopt-u8s8", m, args) for m in args.u8s8]
        variants += [build_variant(model, "ort", m, args) for m in args.ort]
        variants += [build_variant(model, "ort-rr", m, args) for m in args.ort_reduce_range]
        variants += [build_variant(model, "ort-raw", m, args) for m in args.ort_raw]
        reference = logits(variants[0].runner, images, batch)
        ran = [logits(v.runner, images, batch) for v in variants]
        means = [logits(v.reference, images, batch) if v.reference else None for v in variants]
        scores = [score(reference, out, sets, labels) for out in ran]
        meant = [score(reference, out, sets, labels) if out is not None else None for out in means]
        errors = [_relative_errors(reference, k, r, sum(sets)) if r is not None else None
                  for k, r in zip(ran, means, strict=True)]  # fmt: skip
    counts = {"heldout": len(heldout_images), "all": len(images), "labelled": sum(1 for lab in labels if lab)}
    return Evaluation(model, variants, scores, meant, errors, sets, counts, len(calib_images))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = load_average()
    ev = evaluate(args)
    lines = report(args, ev, sys.argv[1:] if argv is None else argv, load_before)
    if args.plot:
        plot(args.plot, ev.variants, ev.scores, ev.counts)
    emit("\n".join(lines) + "\n", args.out)
    return 0


def report(args: argparse.Namespace, ev: Evaluation, argv_used: list[str], load_before: str) -> list[str]:
    model, counts, sets = ev.model, ev.counts, ev.sets
    ort_batch = model.static_batch or even_batch(ev.calib_count)
    return [
        "## Accuracy: trtopt INT8 vs ONNX Runtime quantize_static (CPU)",
        "",
        *header_lines("tools/bench_accuracy.py", argv_used),
        f"- 1-minute load average {load_before} before, {load_average()} after (this benchmark "
        "alone accounts for up to ~2 on 2 cores; more means other jobs inflated the times)",
        f"- model: `{model.name}`; calibration: {ev.calib_count} images from `{rel_path(args.calib)}`; "
        f"held-out: {counts['heldout']} images from "
        f"{' + '.join(f'`{rel_path(f)}` ({n})' for f, n in zip(args.heldout, sets, strict=True))} "
        f"({counts['labelled']} with ImageNet labels); in-sample = held-out + calibration images",
        "- trtopt: `build_plan(BuildConfig(backend='cpu', calib=CalibConfig(method=...)))` (per-channel symmetric INT8 "
        "weights, symmetric per-tensor activations); ORT: `quant_pre_process` (as ORT recommends; "
        "not for the 'no pre-process' rows), then `quantize_static(QuantFormat.QDQ, per_channel=True, "
        "activation_type=QUInt8, weight_type=QInt8, calibrate_method=...)` with default calibrator settings, "
        f"calibration batches of {ort_batch} (ORT's histogram calibrators fail on a ragged last batch)",
        "",
        "### Agreement with FP32, labelled accuracy, build time, kernels",
        "",
        *table(ev.variants, ev.scores, counts),
        "",
        *AGREEMENT_NOTE,
        "",
        "### What each plan means and what this CPU computes",
        "",
        *fidelity_table(ev.variants, ev.scores, ev.meant, ev.errors, counts["heldout"], counts["all"]),
        "",
        *REFERENCE_NOTE,
        "",
        "### Held-out agreement per folder",
        "",
        *per_set_table(ev.variants, ev.scores, [(rel_path(f), n) for f, n in zip(args.heldout, sets, strict=True)]),
    ]


AGREEMENT_NOTE = [
    "Agreement: share of images whose INT8 top-1 class equals FP32's. Cosine: per-image cosine similarity "
    "of INT8 and FP32 logits (mean and worst over held-out). Labelled: the top-1 / any of the top-5 "
    "classes is one of the photo's acceptable ImageNet classes. Kernels: ONNX Runtime's optimised graph "
    "(`trtopt.backend.cpu.builder.kernel_report`): INT8 / float conv kernels, QuantizeLinear + "
    "DequantizeLinear nodes still run as float<->int8 conversions, Pads left in float. 95% CI: Wilson "
    "score interval of the held-out agreement (how far the true rate may lie from this sample's)."
]
REFERENCE_NOTE = [
    "Reference: the same quantised ONNX run by ONNX Runtime with graph optimisations off, so every "
    "QuantizeLinear / DequantizeLinear runs as float math: exactly the INT8 result the model means. "
    "Kernels: as ONNX Runtime runs it, fused into integer kernels (trtopt rows: the plan as `trtopt.Engine` "
    "runs it on this CPU). A gap beyond rounding means the kernels do not compute what the graph says: on "
    "CPUs without VNNI, ONNX Runtime's u8s8 kernels saturate 16-bit pair sums. Held-out photos. The "
    "relative errors are the measures a trtopt build checks (trtopt.verify): it accepts kernels whose "
    "error against the reference is at most 2x the reference's own error against FP32, and never above "
    "0.25 (trtopt.verify.KERNEL_CAP)."
]


def rel_path(path: Path) -> str:
    """`path` relative to the repository root when it lies inside it (for the report), else as given."""
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parents[1]))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
