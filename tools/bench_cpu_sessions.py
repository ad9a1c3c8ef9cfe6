#!/usr/bin/env python3
"""CPU plans as trtopt's sessions run them, against the same plans with ONNX Runtime's QDQ propagation on.

    python tools/bench_cpu_sessions.py zoo:open-nsfw arch:dynamo/squeezenet1_1 [--iterations 30] [--out FILE.md]
    python tools/bench_cpu_sessions.py MODEL.onnx [--out FILE.md] [trtopt build flags: --calib DIR --shapes ...]

trtopt switches ONNX Runtime's QDQPropagationTransformer off in every session that runs a CPU plan
(`trtopt.backend.cpu.builder.DISABLED_OPTIMIZERS` says why). For each model this builds its INT8 plan once
with `trtopt build --no-auto-exclude`, then times FP32 (the original model), the plan in a session with the
optimisers `trtopt.Engine` switches off, and the same plan in a session that leaves the propagation on, at
batch 1 on one intra-op thread, one call of each per round in a rotating order (tools/bench_latency.py's
`interleaved`). It reports medians, the ratios, the ops whose counts differ between the two optimised graphs,
and the largest difference between the two outputs on one random input. `zoo:NAME` / `holdout:NAME` take the
model from the zoo's cache with its catalog's data, preprocessing and static shape; `arch:EXPORTER/NAME` a
torchvision export of tools/bench_architectures.py, calibrated on `calib_data/`; a model not in a cache gets a
"not cached" row.
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

from bench_architectures import CACHE as ARCHITECTURES  # noqa: E402
from bench_architectures import CALIB  # noqa: E402
from bench_auto_groups import cached_model  # noqa: E402
from bench_latency import interleaved  # noqa: E402
from bench_setup import emit, header_lines, load_average, rows_per_model  # noqa: E402

PROPAGATION = "QDQPropagationTransformer"


def located(name: str, flags: list[str]) -> tuple[str, list[str]] | None:
    """The model file and its build flags (None: not in its cache)."""
    if name.startswith("arch:"):
        path = ARCHITECTURES / f"{name[5:]}.onnx"
        return (str(path), ["--calib", str(CALIB)]) if path.exists() else None
    if ":" in name and not Path(name).exists():
        return cached_model(name)
    return name, flags


def optimised_ops(model: bytes, disabled: list[str], folder: Path) -> Counter[str]:
    import onnx
    import onnxruntime as ort

    from trtopt.execution.ort_session import session_options

    path = folder / "optimised.onnx"
    options = session_options(threads=1, opt_level="extended", optimized_model_path=str(path))
    ort.InferenceSession(model, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def measure(model: str, flags: list[str], iterations: int, tmp: Path) -> list[str]:
    """One row: FP32 ms, the plan's ratio to FP32 each way, trtopt's / propagated, ops that differ, output diff."""
    import onnx

    from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS
    from trtopt.backend.cpu.runner import model_for_this_cpu
    from trtopt.cli.main import main
    from trtopt.execution import OrtSession
    from trtopt.plan import read_plan

    path, log = tmp / "plan.engine", io.StringIO()
    with redirect_stderr(log), redirect_stdout(log):
        code = main(["build", model, "--int8", "--backend", "cpu", "--no-auto-exclude", "--cpu-fallback", "off",
                         "-o", str(path), *flags])
    if code != 0:
        raise SystemExit(f"trtopt build failed ({code}):\n{log.getvalue()[-2000:]}")
    plan = read_plan(path)
    spec = plan.inputs[0]
    kernels = onnx.load_from_string(model_for_this_cpu(plan))
    others = [o for o in DISABLED_OPTIMIZERS if o != PROPAGATION]
    # Both plan sessions are plain OrtSessions, so that only the optimiser list differs between them
    # (trtopt.Engine's runner adds its own checks per call, which would weigh on small models).
    ours_session = OrtSession(kernels, threads=1, disabled_optimizers=DISABLED_OPTIMIZERS)
    propagated = OrtSession(kernels, threads=1, disabled_optimizers=others)
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
    feed = {spec.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    fp32 = OrtSession(onnx.load(model), threads=1)
    calls = {"fp32": lambda: fp32.run(feed), "trtopt": lambda: ours_session.run(feed),
             "on": lambda: propagated.run(feed)}  # fmt: skip
    t = interleaved(calls, 1, 3, iterations)
    ours, theirs = ours_session.run(feed), propagated.run(feed)
    diff = max(float(np.max(np.abs(np.asarray(ours[n], np.float64) - np.asarray(theirs[n], np.float64))))
               for n in ours)  # fmt: skip
    data = kernels.SerializeToString()
    a, b = optimised_ops(data, DISABLED_OPTIMIZERS, tmp), optimised_ops(data, others, tmp)
    moved = ", ".join(f"{op} {a[op] - b[op]:+d}" for op in sorted(set(a) | set(b)) if a[op] != b[op]) or "none"
    ms = {k: t.p50(k) for k in calls}
    return [f"{ms['fp32']:.1f}", f"{ms['on'] / ms['fp32']:.2f}", f"{ms['trtopt'] / ms['fp32']:.2f}",
            f"**{ms['trtopt'] / ms['on']:.3f}**", moved, f"{diff:.3g}"]  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="zoo:NAME, holdout:NAME, arch:EXPORTER/NAME, or .onnx files")
    parser.add_argument("--iterations", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument("--out", type=Path)
    args, flags = parser.parse_known_args(argv)
    flags = [f for f in flags if f != "--"]  # build flags for .onnx files given by path
    load = load_average()
    rows = rows_per_model(args.models, lambda name: located(name, flags),
                          lambda path, build, tmp: measure(path, build, args.iterations, tmp), columns=6,
                          fetch_hint="`python tools/zoo.py fetch`, `python tools/bench_holdout.py fetch`, "
                          "`python tools/bench_architectures.py export`")  # fmt: skip
    lines = [
        "## CPU plans: ONNX Runtime's QDQ propagation off", "",
        *header_lines("tools/bench_cpu_sessions.py", argv),
        f"- 1-minute load average {load} before, {load_average()} after (more than ~2 on 2 cores: noisy)",
        f"- each model: one INT8 plan (`--no-auto-exclude`), in an ONNX Runtime session with `trtopt.Engine`'s "
        f"optimiser settings (propagation off) and in one with it on; batch 1, 1 thread, 3 warm-up + "
        f"{args.iterations} interleaved rounds, medians; "
        "`arch:` models have random weights (tools/bench_architectures.py)",
        "",
        "| model | FP32 ms | INT8, propagation on / FP32 | INT8, trtopt's settings / FP32 | trtopt / on | "
        "ops that differ (trtopt's graph minus on's) | largest output difference |",
        "|---|---:|---:|---:|---:|---|---:|",
        *rows,
        "",
    ]  # fmt: skip
    emit("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
