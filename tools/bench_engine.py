#!/usr/bin/env python3
"""What `trtopt.Engine` costs per call over the runtime it wraps: a CPU plan's `Engine.infer` against the same
plan's runner (`trtopt.backend.create_runner`: its ONNX Runtime session, called bare) on the same photos.

    python tools/bench_engine.py [--model models/efficientnet_lite0.onnx | tiny_cnn | light:NAME]
        [--batches 1 8] [--count 16] [--iterations 100] [--warmup 5] [--out FILE.md]

The plan is trtopt's default CPU build (calibrated on the first --count photos of calib_data/), kept INT8 whatever
its speed (`--cpu-fallback off`: this times the API, not the plan). Both calls run one intra-op thread without
spinning, interleaved (one call of each per round, the order rotating), on real preprocessed photos. `Engine.infer`
checks the inputs' names, dtypes and shapes, converts another byte order, and warns of NaN or infinite values (the
input's least and greatest values, then the exact count where one is not finite: `trtopt.engine`); benchmarks that
compare trtopt with other tools time plans through it, the other tools through their bare sessions, so this overhead is
in trtopt's figures. Overhead: the median over rounds of Engine's time / the runner's in the same round, less 1,
with the 90% bootstrap interval of that median (`benchlib.paired_interval`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_setup import CALIB_DIR, DEMO_MODEL, image_dataset, resolve_model, stacked  # noqa: E402
from benchlib import emit, header_lines, interleaved, load_average, paired_interval  # noqa: E402

ENGINE, RUNNER = "Engine.infer", "runner (bare session)"


def build(model_path: Path, calib: str, count: int, out: Path) -> None:
    from trtopt.backend.cpu.options import CpuOptions
    from trtopt.build import BuildConfig, build_plan
    from trtopt.data import DataConfig
    from trtopt.plan import write_plan

    config = BuildConfig(backend="cpu", data=DataConfig(sources=(calib,), count=count),
                         backend_options=(CpuOptions(fallback="off"),))  # fmt: skip
    write_plan(build_plan(model_path, config).plan, out)


def rows(timings: list) -> list[str]:
    lines = [f"| batch | {ENGINE}: median ms | {RUNNER}: median ms | Engine's overhead, 90% interval |",
             "|---:|---:|---:|---|"]  # fmt: skip
    for t in timings:
        ratio, low, high = paired_interval(t.ms[RUNNER], t.ms[ENGINE])
        lines.append(f"| {t.batch} | {t.p50(ENGINE):.2f} | {t.p50(RUNNER):.2f} | {100 * (ratio - 1):+.1f}% "
                     f"({100 * (low - 1):+.1f}% .. {100 * (high - 1):+.1f}%) |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEMO_MODEL))
    parser.add_argument("--calib", default=str(CALIB_DIR))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from trtopt.backend import RunOptions, create_runner
    from trtopt.engine import Engine

    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        model = resolve_model(args.model, Path(tmp))
        if model.static_batch and set(args.batches) != {model.static_batch}:
            raise SystemExit(f"{model.name} has a fixed batch of {model.static_batch}; pass --batches "
                             f"{model.static_batch}")  # fmt: skip
        build(model.path, args.calib, args.count, Path(tmp) / "plan.engine")
        engine = Engine.load(Path(tmp) / "plan.engine", threads=1, spin=False)
        runner = create_runner(engine.plan, RunOptions(threads=1, spin=False))
        images, _ = stacked(image_dataset(model, args.calib, max(args.batches)))
        timings = []
        for batch in args.batches:
            feeds = {model.input_name: np.ascontiguousarray(np.resize(images, (batch, *images.shape[1:])))}
            calls = {ENGINE: lambda f=feeds: engine.infer(f), RUNNER: lambda f=feeds: runner.infer(f)}
            timings.append(interleaved(calls, args.warmup, args.iterations, batch))
        runner.close()
        engine.close()
    lines = [
        f"## Engine's per-call overhead over the bare runtime session, {model.name}",
        "",
        *header_lines("tools/bench_engine.py", sys.argv[1:] if argv is None else argv),
        f"- 1-minute load average {load_before} before, {load_average()} after",
        f"- {args.warmup} warm-up + {args.iterations} timed rounds per batch, 1 intra-op thread, interleaved",
        "",
        *rows(timings),
    ]
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
