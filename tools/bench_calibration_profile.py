#!/usr/bin/env python3
"""Where calibration's CPU time goes, stage by stage, against bare FP32 inference (issue #18).

    python tools/bench_calibration_profile.py [--model models/efficientnet_lite0.onnx | light:resnet50]
        [--size 2880x1920] [--count 32] [--batch 8] [--repeat 5] [--out docs/benchmarks/calibration-profile.md]

Each stage of `trtopt calibrate` runs alone, one after the other, on --count camera-sized photos made
from calib_data/ (tools/realistic_photos.py), and its CPU seconds (user + system, all threads of this
process) are measured: decoding and preprocessing (draft and full), FP32 inference of the original model
(what the "vs FP32" ratio divides by), the optimised model with nothing exposed, the optimised model with
the calibrated tensors exposed (as calibration runs it: outputs written into reused arrays, and, for
comparison, into fresh arrays from `session.run`), and counting them into histograms. Inference runs at
1 and 2 intra-op threads (ONNX Runtime's threads do not spin, as in calibration), in the steady state a
long calibration reaches (every stage once over all the batches before it is timed); each time is the
median of --repeat passes, taken round-robin over the inference rows of one thread count so that other
jobs' load falls on them alike. Overlapping the stages can hide idle time, never CPU time: on C cores
calibration cannot take less wall time than its CPU seconds / C, which this script sets against FP32
inference's. The section also counts the layout conversions ONNX Runtime adds for the exposed tensors.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
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
from bench_setup import DEMO_MODEL  # noqa: E402
from benchlib import emit, header_lines, load_average  # noqa: E402
from realistic_photos import make_photos  # noqa: E402


def measured(fn: Callable[[], Any], repeat: int = 1) -> tuple[Any, float, float]:
    """(result of the last pass, median wall seconds, median CPU seconds of the whole process)."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
        result = fn()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        walls.append(time.perf_counter() - start)
        cpus.append(usage.ru_utime + usage.ru_stime - cpu)
    return result, statistics.median(walls), statistics.median(cpus)


Row = tuple[str, float, float]


def profile(model_path: Path, photos: list[Path], batch: int, repeat: int) -> tuple[list[Row], dict[str, int]]:
    """(stage, wall s, CPU s) per stage for all `photos`, and ONNX Runtime's layout nodes (see `ort_nodes`)."""
    from trtopt.backend import quantizable_tensors
    from trtopt.data import PreprocessConfig, preprocess_image, read_image
    from trtopt.data.preprocess import preprocess_file
    from trtopt.data.samples import preprocess_spec_for
    from trtopt.frontend import onnx_from_graph
    from trtopt.passes import optimize
    from trtopt.passes.config import GraphConfig, load_graph

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
    optimised = onnx_from_graph(graph)
    for threads in (1, 2):
        rows += inference_rows(onnx.load(model_path), optimised, tensors, batches, threads, repeat)
    rows.append(counting_row(tensors, batches, optimised, repeat))
    return rows, ort_nodes(optimised, tensors)


def inference_rows(
    original: onnx.ModelProto,
    optimised: onnx.ModelProto,
    tensors: list[str],
    batches: list,
    threads: int,
    repeat: int,
) -> list[Row]:
    from trtopt.execution import OrtSession
    from trtopt.execution.ort_session import ReusedOutputs

    bare = OrtSession(original, threads=threads, spin=False)
    plain = OrtSession(optimised, threads=threads, spin=False)
    exposed = OrtSession(optimised, expose=tensors, threads=threads, spin=False)
    reused = ReusedOutputs(exposed, tensors, depth=2)
    fresh = [None]  # the last batch's outputs stay alive during the next run, as in calibration

    def run_fresh(feeds: dict) -> None:
        fresh[0] = exposed.run(feeds, outputs=tensors)

    runs = [
        ("FP32 inference, original model", lambda b: bare.run(b)),
        ("inference, optimised model, nothing exposed", lambda b: plain.run(b)),
        (f"inference, optimised model, {len(tensors)} tensors exposed, reused arrays (calibration)", reused.run),
        (f"inference, optimised model, {len(tensors)} tensors exposed, fresh arrays (`session.run`)", run_fresh),
    ]
    for _, run in runs:
        for _ in range(-(-3 // len(batches))):  # warm-up, 3 runs at least: ONNX Runtime's arena and both
            [run(b) for b in batches]  # sets of reused arrays are allocated and touched before the timing
    times: list[list[tuple[float, float]]] = [[] for _ in runs]
    for _ in range(repeat):  # round-robin, so that other jobs' load falls on every row alike
        for timed, (_, run) in zip(times, runs, strict=True):
            timed.append(measured(lambda run=run: [run(b) for b in batches])[1:])
    suffix = f", {threads} thread{'s' if threads > 1 else ''}"
    return [
        (label + suffix, statistics.median(w for w, _ in timed), statistics.median(c for _, c in timed))
        for (label, _), timed in zip(runs, times, strict=True)
    ]


def counting_row(tensors: list[str], batches: list, optimised: onnx.ModelProto, repeat: int) -> Row:
    from trtopt.calib import HistogramCollector
    from trtopt.execution import OrtSession

    session = OrtSession(optimised, expose=tensors, threads=2, spin=False)
    outputs = [session.run(b, outputs=tensors) for b in batches]
    HistogramCollector("warm-up", 2048).update(np.ones((1, 1, 4), np.float32))  # load the compiled loop

    def count() -> None:
        collectors = {t: HistogramCollector(t, 2048) for t in tensors}
        for out in outputs:
            for t in tensors:
                collectors[t].update(out[t])

    _, wall, cpu = measured(count, repeat)
    values = sum(out[t].size for out in outputs for t in tensors) / sum(len(b[next(iter(b))]) for b in batches)
    return (f"counting, {values / 1e6:.1f} M values per image (1 thread)", wall, cpu)


def ort_nodes(optimised: onnx.ModelProto, tensors: list[str]) -> dict[str, int]:
    """Nodes of ONNX Runtime's own optimised graph (level "all"): layout conversions back from its blocked
    NCHWc layout (`ReorderOutput`) and Adds it could not fuse into a conv, without and with the exposed tensors."""
    from collections import Counter

    from trtopt.execution.ort_session import _make_session, session_options, with_exposed_tensors

    counts = {}
    with tempfile.TemporaryDirectory(prefix="bench-profile-ort-") as tmp:
        for label, proto in (("bare", optimised), ("exposed", with_exposed_tensors(optimised, tensors))):
            path = str(Path(tmp) / f"{label}.onnx")
            _make_session(proto, session_options(threads=1, optimized_model_path=path))
            ops = Counter(node.op_type for node in onnx.load(path).graph.node)
            counts[f"{label} ReorderOutput"], counts[f"{label} Add"] = ops["ReorderOutput"], ops["Add"]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEMO_MODEL))
    parser.add_argument("--size", default="2880x1920")
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5, help="timed passes per inference/counting row (median)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        model_path = resolve_model_path(args.model, Path(tmp))
        photos = make_photos(Path(tmp) / "photos", args.count, (width, height))
        rows, nodes = profile(model_path, photos, args.batch, args.repeat)
    fp32_wall = rows[6][1]  # FP32 inference, original model, 2 threads
    lines = [
        f"## Calibration profile: CPU time per stage, {Path(args.model).name}",
        "",
        *header_lines("tools/bench_calibration_profile.py", sys.argv[1:]),
        f"- data: {args.count} photos of {args.size} made at run time by tools/realistic_photos.py; batch "
        f"{args.batch}; each stage run alone; inference and counting in the steady state, medians of "
        f"{args.repeat} passes; 1-minute load average {load} before the run, {load_average()} after "
        "(other jobs on the machine inflate wall times far more than CPU times)",
        "",
        "| stage | wall time | CPU time | CPU ms per image | CPU time / FP32 inference wall time (2 threads) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, wall, cpu in rows:
        lines.append(f"| {name} | {wall:.2f} s | {cpu:.2f} s | {cpu / args.count * 1000:.1f} | "
                     f"{cpu / fp32_wall:.2f}x |")  # fmt: skip
    lines += ["", *summary(rows, nodes, args.count)]
    emit("\n".join(lines) + "\n", args.out)


def summary(rows: list[Row], nodes: dict[str, int], count: int) -> list[str]:
    """What the table means for the 1.3x goal: the CPU time calibration needs against the cores there are."""
    cores = os.cpu_count() or 1
    ms = {name: cpu / count * 1000 for name, _, cpu in rows}
    decode, fp32_cpu, bare_opt, exposed, counting = (rows[i][2] for i in (0, 6, 7, 8, 10))
    fp32_wall = rows[6][1]
    needed, no_decode = decode + exposed + counting, exposed + counting
    fp32_ms = fp32_cpu / count * 1000
    reused_ms, fresh_ms = (rows[i][2] / count * 1000 for i in (8, 9))
    busy = fp32_cpu / fp32_wall
    shared = (
        f" **This run shared the machine: FP32 inference kept only {busy:.2f} of {cores} cores busy (on a quiet "
        "machine it keeps all of them), so this wall-time bound is not meaningful; the CPU-time form below is.**"
        if busy < 0.8 * min(cores, 2)
        else ""
    )
    return [
        f"Calibration must do the draft decoding, the exposed inference and the counting: {needed:.2f} CPU s "
        f"for these {count} photos. On {cores} cores no overlap brings it under {needed / cores:.2f} s of "
        f"wall time, **{needed / cores / fp32_wall:.2f}x** the FP32 inference's {fp32_wall:.2f} s "
        f"(which itself keeps {busy:.2f} cores busy). On inputs that are already tensors "
        f"(no decoding) the bound is {no_decode / cores:.2f} s, **{no_decode / cores / fp32_wall:.2f}x**.{shared}",
        "",
        f"In CPU time per image (2 threads), the load-independent form of the same arithmetic: decoding "
        f"{ms[rows[0][0]]:.1f} ms + exposed inference {exposed / count * 1000:.1f} ms + counting "
        f"{counting / count * 1000:.1f} ms = {needed / count * 1000:.1f} ms against {fp32_ms:.1f} ms for FP32 "
        f"inference ({needed / fp32_cpu:.2f}x; {no_decode / fp32_cpu:.2f}x without decoding). When FP32 "
        f"inference keeps all {cores} cores busy, calibration on the same cores takes at least that many times "
        f"its wall time; 1.3x would leave {0.3 * fp32_ms:.1f} ms per image for everything beyond FP32 inference.",
        "",
        f"Why exposing the tensors costs: the optimised model alone takes {bare_opt / count * 1000:.1f} ms per "
        f"image (the original {fp32_ms:.1f} ms). ONNX Runtime runs convs in its blocked NCHWc layout; its "
        f"optimised graph has {nodes['bare ReorderOutput']} `ReorderOutput` (a conversion back to NCHW) and "
        f"{nodes['bare Add']} unfused `Add` nodes without the exposed tensors, {nodes['exposed ReorderOutput']} "
        f"and {nodes['exposed Add']} with them: every exposed tensor is copied out of the blocked layout, and a "
        "residual Add whose input is exposed is no longer fused into its conv. Outputs written into reused "
        f"arrays (`ReusedOutputs`, as calibration runs) took {reused_ms:.1f} ms per image at 2 threads, fresh "
        f"arrays from `session.run` {fresh_ms:.1f} ms: in this steady state ONNX Runtime's arena already has "
        "its memory; fresh arrays cost page faults (system time) while it grows, in the first batches.",
    ]


if __name__ == "__main__":
    main()
