#!/usr/bin/env python3
"""Where calibration's CPU time goes, stage by stage, against bare FP32 inference (issue #18).

    python tools/bench_calibration_profile.py [--model models/efficientnet_lite0.onnx | light:resnet50]
        [--size 2880x1920] [--count 32] [--batch 8] [--out docs/benchmarks/calibration-profile.md]

Each stage of `trtopt calibrate` runs alone, one after the other, on --count camera-sized photos made
from calib_data/ (tools/realistic_photos.py), and its CPU seconds (user + system, all threads of this
process) are measured: decoding and preprocessing (draft and full), FP32 inference of the original model
(what the "vs FP32" ratio divides by), inference with the calibrated tensors exposed, and counting them
into histograms. Overlapping the stages can hide idle time, never CPU time: on C cores calibration cannot
take less wall time than its CPU seconds / C, which this script sets against FP32 inference's wall time.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_calibration import resolve_model_path  # noqa: E402
from bench_setup import DEMO_MODEL, emit, header_lines, load_average  # noqa: E402
from realistic_photos import make_photos  # noqa: E402


def measured(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of the whole process)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
    result = fn()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return result, time.perf_counter() - start, usage.ru_utime + usage.ru_stime - cpu


def profile(model_path: Path, photos: list[Path], batch: int) -> list[tuple[str, float, float]]:
    """(stage, wall s, CPU s) per stage, for all `photos`."""
    from trtopt.backend import quantizable_tensors
    from trtopt.calib import HistogramCollector
    from trtopt.data import PreprocessConfig, preprocess_image, read_image
    from trtopt.data.preprocess import preprocess_file
    from trtopt.data.samples import preprocess_spec_for
    from trtopt.execution import OrtSession
    from trtopt.frontend import onnx_from_graph
    from trtopt.frontend.config import GraphConfig, load_graph
    from trtopt.passes import optimize

    graph = optimize(load_graph(model_path, GraphConfig(), int8=True, batch=8)).graph
    spec = preprocess_spec_for(model_path, graph, PreprocessConfig())
    tensors = quantizable_tensors(graph)
    rows = []
    samples, wall, cpu = measured(lambda: [preprocess_file(p, spec) for p in photos])
    rows.append(("decode + preprocess, JPEG draft (1 thread)", wall, cpu))
    _, wall, cpu = measured(lambda: [preprocess_image(read_image(p), spec) for p in photos])
    rows.append(("decode + preprocess, full size (1 thread)", wall, cpu))
    name = graph.inputs[0].name
    batches = [{name: np.stack(samples[i : i + batch])} for i in range(0, len(samples), batch)]
    bare = OrtSession(onnx.load(model_path))
    exposed = OrtSession(onnx_from_graph(graph), expose=tensors, spin=False)
    bare.run(batches[0]), exposed.run(batches[0], outputs=tensors)  # warm-up
    _, wall, cpu = measured(lambda: [bare.run(b) for b in batches])
    rows.append(("FP32 inference, original model", wall, cpu))
    outputs, wall, cpu = measured(lambda: [exposed.run(b, outputs=tensors) for b in batches])
    rows.append((f"inference, optimised model, {len(tensors)} tensors exposed", wall, cpu))
    HistogramCollector("warm-up", 2048).update(np.ones((1, 1, 4), np.float32))  # load the compiled loop
    collectors = {t: HistogramCollector(t, 2048) for t in tensors}
    _, wall, cpu = measured(lambda: [collectors[t].update(out[t]) for out in outputs for t in tensors])
    values = sum(out[t].size for out in outputs for t in tensors)
    rows.append((f"counting, {values / len(photos) / 1e6:.1f} M values per image (1 thread)", wall, cpu))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEMO_MODEL))
    parser.add_argument("--size", default="2880x1920")
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        model_path = resolve_model_path(args.model, Path(tmp))
        photos = make_photos(Path(tmp) / "photos", args.count, (width, height))
        rows = profile(model_path, photos, args.batch)
    cores = os.cpu_count() or 1
    per = {name: cpu for name, _, cpu in rows}
    fp32_wall = rows[2][1]
    needed = rows[0][2] + rows[3][2] + rows[4][2]
    lines = [
        f"## Calibration profile: CPU time per stage, {Path(args.model).name}",
        "",
        *header_lines("tools/bench_calibration_profile.py", sys.argv[1:]),
        f"- data: {args.count} photos of {args.size} made at run time by tools/realistic_photos.py; batch "
        f"{args.batch}; each stage run alone; 1-minute load average {load}",
        "",
        "| stage | wall time | CPU time | CPU ms per image | CPU time / FP32 inference wall time |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, wall, cpu in rows:
        lines.append(f"| {name} | {wall:.2f} s | {cpu:.2f} s | {cpu / args.count * 1000:.0f} | "
                     f"{cpu / fp32_wall:.2f}x |")  # fmt: skip
    lines += [
        "",
        f"Calibration must do the draft decoding, the exposed inference and the counting: {needed:.2f} CPU s "
        f"for these {args.count} photos. On {cores} cores no overlap brings it under {needed / cores:.2f} s of "
        f"wall time, **{needed / cores / fp32_wall:.2f}x** the FP32 inference's {fp32_wall:.2f} s "
        f"(which itself keeps {per['FP32 inference, original model'] / fp32_wall:.2f} cores busy).",
    ]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
