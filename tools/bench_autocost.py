#!/usr/bin/env python3
"""What `--method auto` costs over entropy: both calibrations of the same model on the same samples, side by
side in one run, alternating, with medians.

    python tools/bench_autocost.py [--models demo ppocr-rec dddd-det] [--repeats 3] [--calib-count 64]
        [--choices FILE.json] [--out FILE.md]

Each model is loaded and optimised as `trtopt calibrate` does it (tools/bench_autocalib.py's cases and
arrays: the demo on calib_data/, the OCR models on rendered text), then `trtopt.calib.stage.calibrate_graph`
runs with 1 intra-op thread, `--method entropy` and the default `auto` in turns, `--repeats` times each.
Only calibration is timed (histograms, threshold search, auto's scoring), not loading or decoding.
The budget of issue #21 is about one extra forward pass per candidate over the scoring samples:
1 + candidates x scoring samples / calibration samples passes, entropy's cost being 1.
`--choices` writes auto's per-tensor choice and threshold as JSON, to compare two versions of trtopt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_autocalib import arrays, case_for, static_copy  # noqa: E402
from bench_setup import emit, header_lines, load_average  # noqa: E402

DEFAULT_MODELS = ("demo", "ppocr-rec", "dddd-det")
METHODS = ("entropy", "auto")


def prepared(name: str, calib_count: int, workdir: Path) -> dict[str, Any] | None:
    """The optimised graph, its ONNX form, the tensors to calibrate and the dataset, as `trtopt calibrate`
    makes them; None when the model is not on this machine."""
    import onnx

    from trtopt.backend import quantizable_tensors
    from trtopt.data.config import DataConfig, PreprocessConfig
    from trtopt.data.samples import load_samples, preprocess_spec_for
    from trtopt.frontend import onnx_from_graph
    from trtopt.passes import optimize
    from trtopt.passes.config import GraphConfig, load_graph

    case = case_for(name, workdir)
    if case is None:
        return None
    model = static_copy(case, workdir)
    input_name = onnx.load(model).graph.input[0].name
    calib, _ = arrays(case, input_name, calib_count, 1, workdir)
    data = DataConfig(sources=(str(calib),))
    graph_config = GraphConfig()
    graph = optimize(load_graph(model, graph_config, int8=True, batch=data.batch), graph_config.passes).graph
    preprocess = PreprocessConfig(preset=None if case.data == "photos" else "raw")
    dataset = load_samples(graph, preprocess_spec_for(model, graph, preprocess), data)
    return {"graph": graph, "proto": onnx_from_graph(graph), "tensors": quantizable_tensors(graph),
            "dataset": dataset, "data": data}  # fmt: skip


def timed(setup: dict[str, Any], method: str) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of the process, Calibration) of one calibration."""
    from trtopt.calib.config import CalibConfig
    from trtopt.calib.stage import calibrate_graph

    config = CalibConfig(method=method, threads=1)
    wall, cpu = time.perf_counter(), time.process_time()
    calibration = calibrate_graph(setup["graph"], setup["proto"], setup["tensors"], config,
                                  dataset=setup["dataset"], data=setup["data"])  # fmt: skip
    return time.perf_counter() - wall, time.process_time() - cpu, calibration


def measure(setup: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Medians per method over `repeats` alternating runs, after one untimed warm-up of each."""
    from trtopt.calib.auto import SCORE_SAMPLES
    from trtopt.calib.thresholds import AUTO_CANDIDATES

    for method in METHODS:
        timed(setup, method)
    runs: dict[str, list[tuple[float, float, Any]]] = {m: [] for m in METHODS}
    for _ in range(repeats):
        for method in METHODS:
            runs[method].append(timed(setup, method))
    result: dict[str, Any] = {}
    for method, found in runs.items():
        result[method] = {
            "wall": statistics.median(r[0] for r in found),
            "cpu": statistics.median(r[1] for r in found),
            "collect": statistics.median(r[2].timings.collect_s for r in found),
            "threshold": statistics.median(r[2].timings.threshold_s for r in found),
            "samples": found[0][2].num_samples,
        }
    auto = runs["auto"][0][2]
    scored = len(setup["dataset"]) - auto.num_samples or min(SCORE_SAMPLES, len(setup["dataset"]))
    result["budget"] = 1 + len(AUTO_CANDIDATES) * scored / result["entropy"]["samples"]
    result["scored_samples"] = scored
    result["choices"] = {n: [auto.choices[n], auto.amax[n]] for n in auto.amax} if auto.choices else {}
    return result


TITLE = "## Auto calibration cost: `--method auto` vs entropy, side by side"
INTRO = (
    "Calibration alone (`trtopt.calib.stage.calibrate_graph`, as `trtopt calibrate` and `trtopt build --int8` "
    "run it: histograms, threshold search, auto's scoring), 1 intra-op thread, on {count} calibration samples; "
    "entropy and auto alternate, {repeats} runs each after one warm-up of each, medians. Wall seconds on a "
    "machine shared with other jobs (1-minute load average {load} at the start, {end} at the end), and the "
    "process's CPU seconds (histogram counting threads included), which other jobs inflate less. auto "
    "histograms {hist} of the samples and scores its candidates on the other {scored}. *budget* is issue "
    "#21's: 1 + candidates ({cands}) x scoring samples / entropy's samples, in forward passes, entropy's "
    "calibration counting as 1."
)


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| model | tensors | entropy wall s | auto wall s | auto / entropy (wall) | entropy CPU s | auto CPU s | "
        "auto / entropy (CPU) | budget | auto: histograms s + thresholds & scoring s | auto's choices |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, r in results.items():
        if r is None:
            lines.append(f"| {name} | not cached |" + " – |" * 9)
            continue
        e, a = r["entropy"], r["auto"]
        counts = Counter(method for method, _ in r["choices"].values())
        lines.append(
            f"| {name} | {len(r['choices'])} | {e['wall']:.2f} | {a['wall']:.2f} | "
            f"{a['wall'] / e['wall']:.2f}x | {e['cpu']:.2f} | {a['cpu']:.2f} | {a['cpu'] / e['cpu']:.2f}x | "
            f"{r['budget']:.2f}x | {a['collect']:.2f} + {a['threshold']:.2f} | "
            + ", ".join(f"{m} {c}" for m, c in sorted(counts.items())) + " |"
        )
    return lines


def main() -> None:
    from trtopt.calib.thresholds import AUTO_CANDIDATES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[*DEFAULT_MODELS])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calib-count", type=int, default=64)
    parser.add_argument("--choices", type=Path, help="write auto's choices per model and tensor here (JSON)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load = load_average()
    results: dict[str, Any] = {}
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="bench-autocost-") as tmp:
            setup = prepared(name, args.calib_count, Path(tmp))
            results[name] = None if setup is None else measure(setup, args.repeats)
        print(name, {k: v for k, v in (results[name] or {}).items() if k != "choices"}, file=sys.stderr, flush=True)
    first = next((r for r in results.values() if r is not None), None)
    hist = first["auto"]["samples"] if first else "–"
    scored = first["scored_samples"] if first else "–"
    intro = INTRO.format(count=args.calib_count, repeats=args.repeats, load=load, end=load_average(), hist=hist,
                         scored=scored, cands=len(AUTO_CANDIDATES))  # fmt: skip
    lines = [TITLE, "", *header_lines("tools/bench_autocost.py", sys.argv[1:]), "", intro, "", *table(results)]
    emit("\n".join(lines) + "\n", args.out)
    if args.choices:
        args.choices.write_text(json.dumps({n: r["choices"] for n, r in results.items() if r}, indent=1))


if __name__ == "__main__":
    main()
