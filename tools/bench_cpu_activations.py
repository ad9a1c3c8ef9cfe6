#!/usr/bin/env python3
"""CPU plans with GELU / SiLU written as ONNX Runtime's fused kernels, against the same plans without, side by side.

    python tools/bench_cpu_activations.py zoo:ddddocr-det holdout:ppocr-v6-det [--iterations 30] [--out FILE.md]
    python tools/bench_cpu_activations.py MODEL.onnx [--out FILE.md] [trtopt build flags: --calib DIR --shapes ...]

ONNX Runtime cannot fuse an activation that reads its input twice once that input comes from a DequantizeLinear
(`trtopt.backend.cpu.activations` says why), so the CPU lowering writes the fused Gelu / QuickGelu itself. For
each model this builds its INT8 plan twice in this process with `trtopt build --no-auto-exclude` (the same
calibration, so the same thresholds): once as trtopt builds it, once with that rewrite switched off. It then
times FP32 (the original model) and both plans at batch 1 on one intra-op thread, one call of each per round in
a rotating order (tools/bench_latency.py's `interleaved`), and reports medians, the ratios and the largest
difference between the two plans' outputs. `zoo:NAME` / `holdout:NAME` take the model from the zoo's cache with
its catalog's data, preprocessing and static shape; a model not in the cache gets a "not cached" row.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_auto_groups import cached_model  # noqa: E402
from bench_latency import interleaved  # noqa: E402
from bench_setup import emit, header_lines, load_average, rows_per_model  # noqa: E402

FUSED_OPS = ("Gelu", "QuickGelu")


def build(model: str, flags: list[str], out: Path, fused: bool) -> None:
    """`trtopt build --int8 --no-auto-exclude --cpu-fallback off` of `model` (an INT8 plan even where INT8 does
    not pay here: the benchmark times INT8), with or without the activation rewrite."""
    import trtopt.backend.cpu.lowering as lowering
    from trtopt.backend.cpu.activations import fuse_activations
    from trtopt.cli.main import main

    lowering.fuse_activations = fuse_activations if fused else (lambda model: {})  # type: ignore[assignment]
    log = io.StringIO()
    try:
        with redirect_stderr(log), redirect_stdout(log):
            code = main(["build", model, "--int8", "--backend", "cpu", "--no-auto-exclude", "--cpu-fallback", "off",
                         "-o", str(out), *flags])
    finally:
        lowering.fuse_activations = fuse_activations  # type: ignore[assignment]
    if code != 0:
        raise SystemExit(f"trtopt build failed ({code}):\n{log.getvalue()[-2000:]}")


def measure(model: str, flags: list[str], iterations: int, tmp: Path) -> list[str]:
    """One table row: fused counts, FP32 ms, both plans' ratios to FP32, fused / unfused, outputs' difference."""
    import onnx

    from trtopt import Engine
    from trtopt.execution import OrtSession
    from trtopt.plan import read_plan

    paths = {label: tmp / f"{label}.engine" for label in ("unfused", "fused")}
    for label, path in paths.items():
        build(model, flags, path, fused=label == "fused")
    plan_ops = Counter(n.op_type for n in onnx.load_from_string(read_plan(paths["fused"]).sections["onnx"]).graph.node)
    engines = {label: Engine.load(path, threads=1) for label, path in paths.items()}
    spec = engines["fused"].inputs[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
    feeds = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    fp32 = OrtSession(onnx.load(model), threads=1)
    feed = {spec.name: feeds}
    calls = {"fp32": lambda: fp32.run(feed), **{k: (lambda e=e: e.infer(feed)) for k, e in engines.items()}}
    t = interleaved(calls, 1, 3, iterations)
    outs = [engines[k].infer(feed) for k in ("unfused", "fused")]
    diff = max(float(np.max(np.abs(np.asarray(outs[0][n], np.float64) - np.asarray(outs[1][n], np.float64))))
               for n in outs[0])  # fmt: skip
    ms = {k: t.p50(k) for k in calls}
    fused = ", ".join(f"{plan_ops[op]} {op}" for op in FUSED_OPS if plan_ops[op]) or "none"
    return [fused, f"{ms['fp32']:.1f}", f"{ms['unfused'] / ms['fp32']:.2f}", f"{ms['fused'] / ms['fp32']:.2f}",
            f"**{ms['fused'] / ms['unfused']:.3f}**", f"{diff:.3g}"]  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="zoo:NAME / holdout:NAME from the zoo's cache, or .onnx files")
    parser.add_argument("--iterations", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument("--out", type=Path)
    args, flags = parser.parse_known_args(argv)
    flags = [f for f in flags if f != "--"]  # build flags for .onnx files given by path
    load = load_average()

    def locate(name: str) -> tuple[str, list[str]] | None:
        return cached_model(name) if ":" in name and not Path(name).exists() else (name, flags)

    rows = rows_per_model(args.models, locate, lambda path, build, tmp: measure(path, build, args.iterations, tmp),
                          columns=6, fetch_hint="`python tools/zoo.py fetch`, `python tools/bench_holdout.py fetch`")
    lines = [
        "## CPU plans: GELU and SiLU as ONNX Runtime's fused kernels", "",
        *header_lines("tools/bench_cpu_activations.py", argv),
        f"- 1-minute load average {load} before, {load_average()} after (more than ~2 on 2 cores: noisy)",
        f"- each model: its INT8 plan built twice (`--no-auto-exclude`, same thresholds), with and without the "
        f"rewrite; batch 1, 1 thread, 3 warm-up + {args.iterations} interleaved rounds, medians",
        "",
        "| model | fused in the plan | FP32 ms | INT8 without / FP32 | INT8 with / FP32 | with / without | "
        "largest output difference |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]  # fmt: skip
    emit("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
