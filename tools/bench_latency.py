#!/usr/bin/env python3
"""CPU latency and throughput per batch size: the FP32 model, trtopt's INT8 plan and ONNX Runtime's own
quantize_static QDQ model, all on ONNX Runtime's CPU provider with the same thread count.

    python tools/bench_latency.py [--model models/efficientnet_lite0.onnx | tiny_cnn | light:resnet50] [--plan P]
        [--batches 1 8 32] [--threads 1] [--iterations 50] [--warmup 5] [--out FILE.md] [--plot FILE.png]

The INT8 plan is built here (entropy calibration on the first --count images of --calib) unless --plan
names one; ORT's models are quantize_static(QDQ, per-channel QInt8 weights, QUInt8 activations, MinMax
calibration on the same images) — the calibration method changes scales, not kernels, so not latency —
once after quant_pre_process (ORT's recommended flow) and once on the model as it is.
Measurements are interleaved: every round times one call of each model, in an order that rotates from
round to round, so drift (thermal, other load) hits all models alike. Latency: median and p90 of the
rounds (trtexec's percentile rule, trtopt.bench); images/s: batch / median latency; speed-up: the median
over rounds of FP32 time / INT8 time, measured in the same round. Inputs are real preprocessed photos.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_setup import (  # noqa: E402
    CALIB_DIR,
    DEMO_MODEL,
    ModelUnderTest,
    image_dataset,
    kernel_counts,
    ort_build,
    resolve_model,
    stacked,
    trtopt_build,
)
from benchlib import Timings, emit, header_lines, interleaved, load_average, plt_or_none, save_figure  # noqa: E402

from trtopt.execution.ort_session import OrtSession  # noqa: E402

FP32 = "FP32 (original)"
TRTOPT = "trtopt INT8"
ORT = "ORT QDQ INT8"
ORT_RAW = "ORT QDQ INT8, no pre-process"
ORT_RR = "ORT QDQ INT8, reduce_range"


def sessions(
    model: ModelUnderTest, args: argparse.Namespace, workdir: Path
) -> tuple[dict, dict[str, str], dict[str, bytes]]:
    """{name: OrtSession} for every model compared, a note per INT8 model on how it was made, and the ONNX
    bytes each INT8 model runs (trtopt's: the plan as `trtopt.Engine` runs it on this CPU)."""
    from trtopt.backend.cpu.runner import model_for_this_cpu
    from trtopt.plan import Plan

    runners = {FP32: OrtSession(onnx.load(model.path), threads=args.threads)}
    notes = {}
    if args.plan:
        from trtopt.plan import read_plan

        plan = read_plan(args.plan)
        if plan.backend != "cpu":
            raise SystemExit(f"--plan {args.plan}: a {plan.backend!r} plan; this benchmark runs CPU plans")
        trtopt_bytes = plan.sections["onnx"]
        notes[TRTOPT] = f"plan `{args.plan}`"
    else:
        seconds, trtopt_bytes = trtopt_build(model, str(args.calib), args.count, "entropy")
        notes[TRTOPT] = f"built here, entropy calibration, {seconds:.1f} s"
    sources = {TRTOPT: model_for_this_cpu(Plan("cpu", (), (), {"onnx": trtopt_bytes}))}
    variants = ((ORT, True, False), (ORT_RR, True, True), (ORT_RAW, False, False))
    for name, preprocess, reduce_range in variants if not args.no_ort else ():
        seconds, sources[name] = ort_build(model, str(args.calib), args.count, "minmax", preprocess, reduce_range)
        how = "quant_pre_process + quantize_static" if preprocess else "quantize_static on the model as it is"
        notes[name] = f"{how}, QDQ, MinMax calibration{', reduce_range' if reduce_range else ''}, {seconds:.1f} s"
    for name, source in sources.items():
        runners[name] = OrtSession(onnx.load_from_string(source), threads=args.threads)
        k = kernel_counts(source)
        notes[name] += (f"; ONNX Runtime runs INT8 convs: {k.int8_convs}, float convs: {k.float_convs}, "
                        f"Q/DQ conversions: {k.conversions}, float Pads: {k.float_pads}")
    return runners, notes, sources


def fidelity(sources: dict[str, bytes], images: np.ndarray, model: ModelUnderTest) -> dict[str, str]:
    """Per INT8 model: its kernels against its own Q/DQ graph run as float math (trtopt.verify), so a fast
    row cannot hide kernels that compute something else."""
    from trtopt.metrics.agreement import agreement
    from trtopt.verify import collect

    step = model.static_batch or len(images)
    batches = [({model.input_name: images[i : i + step]}, step) for i in range(0, len(images) - step + 1, step)]
    result = {}
    for name, source in sources.items():
        kernels = collect(OrtSession(onnx.load_from_string(source)).run, batches)
        reference = collect(OrtSession(onnx.load_from_string(source), opt_level="disable").run, batches)
        result[name] = agreement(kernels, reference).describe()
    return result


def table(results: list[Timings]) -> list[str]:
    rows = [
        "| batch | model | median | p90 | images/s | speed-up vs FP32 (paired) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for t in results:
        for name in t.ms:
            speedup = "1.00x" if name == FP32 else f"**{t.speedup(name):.2f}x**"
            rows.append(
                f"| {t.batch} | {name} | {t.p50(name):.2f} ms | {t.p90(name):.2f} ms "
                f"| {t.batch / t.p50(name) * 1e3:.1f} | {speedup} |"
            )
    return rows


def plot(path: Path, results: list[Timings], threads: int) -> None:
    plt = plt_or_none()
    if plt is None:
        return
    names = list(results[0].ms)
    fig, ax = plt.subplots(figsize=(8, 4.6))
    width = 0.8 / len(names)
    x = np.arange(len(results))
    for i, name in enumerate(names):
        values = [t.batch / t.p50(name) * 1e3 for t in results]
        bars = ax.bar(x + (i - (len(names) - 1) / 2) * width, values, width, label=name)
        labels = ["" if name == FP32 else f"{t.speedup(name):.2f}x" for t in results]
        ax.bar_label(bars, labels=labels, fontsize=8)
    ax.set_xticks(x, [f"batch {t.batch}" for t in results])
    ax.set_ylabel("images / s (median latency)")
    ax.set_title(f"ONNX Runtime CPU throughput, {threads} intra-op thread(s); labels: speed-up vs FP32")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(names))
    save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default=str(DEMO_MODEL),
        help="ONNX file, trtopt.zoo name (e.g. tiny_cnn) or light:NAME (e.g. light:resnet50, random weights)",
    )
    parser.add_argument("--plan", type=Path, help="a CPU plan to time instead of building one here")
    parser.add_argument("--calib", type=Path, default=CALIB_DIR, help="calibration images (also the inputs)")
    parser.add_argument("--count", type=int, default=32, help="calibration images for the builds (default 32)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    parser.add_argument("--iterations", type=int, default=50, help="timed rounds per batch size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds per batch size")
    parser.add_argument("--no-ort", action="store_true", help="leave out ORT's quantize_static models")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    parser.add_argument("--plot", type=Path, help="write a throughput bar chart (PNG) here")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0 or args.threads < 1 or min(args.batches) < 1:
        parser.error("--iterations, --threads and --batches must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        model = resolve_model(args.model, Path(tmp))
        if model.static_batch and set(args.batches) != {model.static_batch}:
            raise SystemExit(f"{model.name} has a fixed batch of {model.static_batch}; pass --batches "
                             f"{model.static_batch}")
        images, _ = stacked(image_dataset(model, args.calib, max(args.batches)))
        runners, notes, sources = sessions(model, args, Path(tmp))
        probe, _ = stacked(image_dataset(model, args.calib, 16))
        checked = fidelity(sources, probe, model)
    results = []
    for batch in args.batches:
        feeds = {model.input_name: np.resize(images, (batch, *images.shape[1:]))}  # repeats photos if too few
        calls = {name: (lambda r=runner, f=feeds: r.run(f)) for name, runner in runners.items()}
        results.append(interleaved(calls, args.warmup, args.iterations, batch))

    argv_used = sys.argv[1:] if argv is None else argv
    lines = [
        f"## Latency: FP32 vs INT8 on ONNX Runtime CPU, {model.name}",
        "",
        *header_lines("tools/bench_latency.py", argv_used),
        f"- 1-minute load average {load_before} before, {load_average()} after (this benchmark "
        "alone accounts for up to ~2 on 2 cores; more means other jobs inflated the times)",
        f"- model: `{model.name}`; {args.threads} intra-op thread(s), inter-op 1; ORT graph optimisations: all; "
        f"{args.warmup} warm-up + {args.iterations} timed rounds per batch size, interleaved",
        *(f"- {name}: {note}" for name, note in notes.items()),
        "",
        "### Kernels vs reference (16 calibration photos)",
        "",
        "| model | kernels vs its Q/DQ graph run as float math |",
        "|---|---|",
        *(f"| {name} | {text} |" for name, text in checked.items()),
        "",
        "What each INT8 model computes on this CPU against what its graph means (trtopt.verify's measure): "
        "a relative error far above the few percent of rounding means the timed kernels compute something "
        "else (ONNX Runtime's u8s8 kernels saturate on CPUs without VNNI).",
        "",
        f"### Latency per batch size ({args.threads} thread(s))",
        "",
        *table(results),
        "",
        "Median / p90: per-call wall time over the rounds. Images/s: batch / median. Speed-up: median over "
        "rounds of FP32 time / INT8 time within the same round.",
    ]
    if args.plot:
        plot(args.plot, results, args.threads)
    text = "\n".join(lines) + "\n"
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
