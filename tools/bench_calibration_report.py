"""The markdown report of tools/bench_calibration.py: header, timing and memory, draft decoding, thresholds.

Not a benchmark itself; the numbers come from the workers tools/bench_calibration.py runs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import cpu_class, cpu_model


@dataclass(frozen=True)
class Run:
    """What the report states about the run besides the results."""

    model: str  # as the user named it
    tensors: int  # calibrated tensors (ONNX Runtime's default selection)
    limit_mb: float  # memory limit per worker
    load_before: float  # 1-minute load average before the runs
    compile_s: float  # numba's first compilation of the counting loop


def report(args: argparse.Namespace, run: Run, results: dict[tuple[str, int], dict]) -> list[str]:
    """The report's lines: header, the timing table, and the tables the results allow."""
    lines = _header(args, run) + [*timing_table(results, args.methods, args.counts)]
    for count in args.counts:
        if draft := draft_table(results, count):
            lines += ["", f"### JPEG draft decoding: thresholds over those of full decoding ({count} inputs)", "",
                      *draft]
    usable = [c for c in args.counts if "amax" in results.get(("ort-entropy", c), {})]
    if usable:
        lines += ["", f"### Thresholds relative to ORT entropy ({usable[-1]} inputs)", "",
                  *threshold_table(results, args.methods, usable[-1])]
    return lines + _notes(run)


def _header(args: argparse.Namespace, run: Run) -> list[str]:
    data = f"images from {args.images}" if args.images else "synthetic random-normal inputs"
    if args.photos:
        data = (f"{max(args.counts)} photos of {args.photos} (JPEG quality 90, about 0.85 MB each) made at run time "
                "from calib_data/ by tools/realistic_photos.py (upscaled, with sensor-like grain)")
    return [
        "## Calibration: trtopt vs ONNX Runtime" + (f" vs FP32 inference, {run.model} on {args.photos} photos"
                                                    if args.photos else f", {run.model} on {data.split(',')[0]}"),
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine()}; {cpu_class()}",
        f"- versions: {versions()}",
        f"- command: `python {' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}`",
        f"- model: `{run.model}`, {run.tensors} tensors (ORT's default selection), {data}, "
        f"batch {args.batch}; memory limit per worker {run.limit_mb / 1024:.1f} GiB; median of {args.repeat} runs "
        "(round-robin)",
        f"- 1-minute load average {run.load_before:.2f} before, {os.getloadavg()[0]:.2f} after (other jobs on "
        "the machine inflate wall times)",
        "",
        "### Wall time and peak memory (fresh process per row)",
        "",
    ]


def _notes(run: Run) -> list[str]:
    return [
        "",
        "Notes: ONNX Runtime's histogram calibrators keep every intermediate output of every batch in memory",
        "until `collect_data` returns, so their memory grows with the number of inputs (onnxruntime#10503,",
        "#21979). trtopt reads the data once, holding two batches of activations at a time (one counted while",
        "the next runs) and a fixed histogram grid per tensor (exact re-binning as the range grows), so its",
        "memory is flat. Image files are decoded two batches ahead by a pool of threads. Its counting",
        "loop is compiled by numba and cached on disk: the trtopt rows load it from that cache; the first",
        f"calibration on a machine compiles it once, measured here at {run.compile_s:.1f} s.",
    ]


def machine() -> str:
    cpu = cpu_model()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    system = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {os.cpu_count()} logical CPUs, {total:.0f} GiB RAM, {system}"


def versions() -> str:
    import onnx
    import onnxruntime

    import trtopt

    return (f"Python {platform.python_version()}, numpy {np.__version__}, onnx {onnx.__version__}, "
            f"onnxruntime {onnxruntime.__version__}, trtopt {trtopt.__version__}")


def timing_table(results: dict[tuple[str, int], dict], methods: list[str], counts: list[int]) -> list[str]:
    lines = ["| method | inputs | wall time | inputs/s | CPU time | peak RSS | vs FP32 inference | vs ORT entropy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for count in counts:
        ort = results.get(("ort-entropy", count), {})
        fp32 = results.get(("fp32", count), {})
        for method in methods:
            r = results[(method, count)]
            if "failed" in r:
                lines.append(f"| {method} | {count} | {r['failed']} after {r['wall_s']:.1f} s | – | – | "
                             f"> {r['peak_mb'] / 1024:.1f} GiB | – | – |")
                continue
            ok = "wall_s" in ort and "failed" not in ort
            speedup = f"{ort['wall_s'] / r['wall_s']:.1f}x faster" if ok else "–"
            if "failed" in ort and method.startswith("trtopt") and ort["wall_s"] > r["wall_s"]:
                speedup = f"> {ort['wall_s'] / r['wall_s']:.1f}x faster"  # ORT was killed before it finished
            cost = f"{r['wall_s'] / fp32['wall_s']:.2f}x" if "wall_s" in fp32 and "failed" not in fp32 else "–"
            lines.append(f"| {method} | {count} | {r['wall_s']:.1f} s | {count / r['wall_s']:.1f} | "
                         f"{r['cpu_s']:.1f} s | {r['peak_mb'] / 1024:.2f} GiB | {cost} | {speedup} |")
    return lines


def draft_table(results: dict[tuple[str, int], dict], count: int) -> list[str]:
    """Thresholds with JPEG draft decoding over those with full decoding, same photos."""
    draft = results.get(("trtopt-entropy", count), {}).get("amax")
    full = results.get(("trtopt-entropy-full-decode", count), {}).get("amax")
    if not draft or not full:
        return []
    ratios = [draft[t] / full[t] for t in full if t in draft and full[t] > 0]
    deviation = sorted(abs(r - 1) for r in ratios)
    p90 = deviation[int(0.9 * (len(deviation) - 1))]
    return [r"| tensors | median \|T_draft / T_full - 1\| | 90th pct | max | identical |",
            "|---:|---:|---:|---:|---:|",
            f"| {len(ratios)} | {statistics.median(deviation):.4f} | {p90:.4f} | {deviation[-1]:.4f} | "
            f"{sum(d == 0 for d in deviation)} |"]


def median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (a failed run stands for the method)."""
    failed = [r for r in runs if "failed" in r]
    return failed[0] if failed else sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2]


def threshold_table(results: dict[tuple[str, int], dict], methods: list[str], count: int) -> list[str]:
    reference = results[("ort-entropy", count)]["amax"]
    ort_max = results.get(("ort-minmax", count), {}).get("amax", {})
    lines = ["| method | tensors | median T / T_ort | 10th pct | 90th pct | min | max | T < 0.99 T_ort |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for method in methods:
        amax = results[(method, count)].get("amax")
        if not amax or method == "trtopt-calibrate":  # other tensors: those of the optimised graph
            continue
        ratios = [amax[t] / reference[t] for t in reference if t in amax and reference[t] > 0]
        deciles = statistics.quantiles(ratios, n=10)
        below = sum(r < 0.99 for r in ratios)
        lines.append(f"| {method} | {len(ratios)} | {statistics.median(ratios):.3f} | {deciles[0]:.3f} | "
                     f"{deciles[-1]:.3f} | {min(ratios):.3f} | {max(ratios):.3f} | {below} |")
    if ort_max:
        same = sum(abs(reference[t] - ort_max[t]) <= 1e-6 * max(ort_max[t], 1e-12)
                   for t in reference if t in ort_max)
        lines.append("")
        lines.append(f"ORT entropy (default 128 bins / 128 levels) equals ORT max on {same} of "
                     f"{len(reference)} tensors: with one candidate its search degenerates to max "
                     "(onnxruntime#9597).")
    return lines
