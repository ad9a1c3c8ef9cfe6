"""Measure a plan's latency (p50/p90/p99, as trtexec computes them) and throughput per batch size.

examples:
  trtopt bench plan.engine --batch 1,8,32
  trtopt bench plan.engine --batch 1,8,32 --iterations 500 --json > bench.json
  trtopt bench plan.engine --batch 1,2,4,8,16,32,64 --plot throughput.png

Inputs are random data of each input's dtype. On the TensorRT backend each call is timed on the GPU with
CUDA events (copies in and out included); on the CPU backend with the host clock.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trtopt.errors import TrtoptError, format_shape
from trtopt.frontend.writer import write_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", type=Path, help="plan file written by `trtopt build`")
    parser.add_argument(
        "--batch", type=parse_batches, default=[1], help="comma-separated batch sizes (default: 1)"
    )
    parser.add_argument(
        "--iterations", type=int, default=100, help="timed calls per batch size (default: 100)"
    )
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls first (default: 10)")
    parser.add_argument("--min-seconds", type=float, default=0.0, help="keep timing at least this long")
    parser.add_argument("--threads", type=int, default=None, help="CPU backend: intra-op threads")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument(
        "--plot", type=Path, default=None, help="save latency/throughput vs batch as an image"
    )


def parse_batches(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected positive batch sizes like 1,8,32, got {text!r}")
    return sizes


def run(args: argparse.Namespace) -> int:
    import trtopt

    if args.iterations < 1 or args.warmup < 0:
        raise TrtoptError("--iterations must be at least 1 and --warmup at least 0.")
    if not 0 <= args.min_seconds < float("inf"):
        raise TrtoptError(f"--min-seconds must be a finite number of seconds, 0 or more; got {args.min_seconds}.",
                          fix="Leave it out (0: just --iterations calls), or give e.g. --min-seconds 5.")
    with trtopt.Engine.load(args.plan, threads=args.threads) as engine:
        return _bench(args, engine)


def _bench(args: argparse.Namespace, engine: Any) -> int:
    from trtopt.bench import measure
    from trtopt.cli.console import print_json

    fn, timing = timing_function(engine)
    results = measure(
        fn,
        lambda batch: random_inputs(engine.inputs, batch),
        args.batch,
        warmup=args.warmup,
        iterations=args.iterations,
        min_seconds=args.min_seconds,
    )
    if args.json:
        print_json(
            {
                "plan": str(args.plan),
                "backend": engine.backend,
                "timing": timing,
                "results": [r.to_dict() for r in results],
            }
        )
    else:
        _print_table(results, f"{args.plan.name} on {engine.backend} ({timing} timing)")
    if args.plot is not None:
        plot_results(results, args.plot, title=f"{args.plan.name} ({engine.backend})")
    return 0


def timing_function(engine: Any) -> tuple[Callable[[Any], Any], str]:
    """The device clock where the engine's runner has one (`Engine.timing`, e.g. CUDA events), else host."""
    if engine.timing != "host":
        return (lambda feeds: engine.timed_infer(feeds)[1]), engine.timing
    return engine.infer, "host"


def random_inputs(specs: Sequence[Any], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random data shaped like each input, with the dynamic (-1) batch dimension set to `batch`."""
    from trtopt.data.inputs import random_array, unbatched_image
    from trtopt.memory import require_memory, tensor_bytes

    rng = np.random.default_rng(seed)
    feeds = {}
    needed = sum(tensor_bytes([batch if d == -1 else max(d, 1) for d in s.shape], s.dtype) for s in specs)
    require_memory(
        2 * needed,  # the float64 draw, then the cast
        f"Random inputs for batch {batch} ({needed / 2**20:,.0f} MiB before the model's own activations)",
        "Bench smaller batches, e.g. --batch 1,8,32.",
    )
    for spec in specs:
        shape = list(spec.shape)
        if unbatched_image(shape):  # [3, H, W]: one image per call, its first dimension the colours
            if batch != 1:
                raise TrtoptError(
                    f"Input {spec.name!r} is one image without a batch axis ({format_shape(shape)}): the plan runs "
                    f"one image per call, so batch {batch} cannot run.",
                    fix="Bench with --batch 1 (the default); N images take N calls.",
                )
        elif shape and shape[0] == -1:
            shape[0] = batch
        elif shape and shape[0] != batch:
            raise TrtoptError(
                f"Input {spec.name!r} has a fixed batch of {shape[0]}, so batch {batch} cannot run.",
                fix=f"Bench with --batch {shape[0]}, or rebuild the plan with a dynamic batch (--batch N).",
            )
        if any(d < 1 for d in shape):
            raise TrtoptError(f"Input {spec.name!r} has a dynamic dimension besides the batch: {spec.shape}.")
        feeds[spec.name] = random_array(rng, shape, spec.dtype)
    return feeds


def _print_table(results: Sequence[Any], title: str) -> None:
    from rich.table import Table

    from trtopt.cli.console import out

    table = Table(title=title)
    for column in ("batch", "iters", "p50 ms", "p90 ms", "p99 ms", "mean ms", "samples/s"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.batch),
            str(r.iterations),
            f"{r.p50_ms:.3f}",
            f"{r.p90_ms:.3f}",
            f"{r.p99_ms:.3f}",
            f"{r.mean_ms:.3f}",
            f"{r.throughput:,.1f}",
        )
    out.print(table)


def plot_results(results: Sequence[Any], path: Path, *, title: str) -> Path:
    """Latency (p50 with p90/p99 marks) and throughput against batch size, saved to `path`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TrtoptError(
            "--plot needs matplotlib, which is not installed.", fix="pip install 'trtopt[plot]'"
        ) from None
    batches = [r.batch for r in results]
    fig, latency_axis = plt.subplots(figsize=(7, 4))
    latency_axis.plot(batches, [r.p50_ms for r in results], "o-", label="p50 latency")
    latency_axis.plot(batches, [r.p99_ms for r in results], "x--", label="p99 latency")
    latency_axis.set_xscale("log", base=2)
    latency_axis.set_xlabel("batch size")
    latency_axis.set_ylabel("latency (ms)")
    throughput_axis = latency_axis.twinx()
    throughput_axis.plot(
        batches, [r.throughput for r in results], "s-", color="tab:green", label="throughput"
    )
    throughput_axis.set_ylabel("samples / s")
    handles = latency_axis.get_legend_handles_labels()[0] + throughput_axis.get_legend_handles_labels()[0]
    latency_axis.legend(handles=handles, loc="upper left")
    latency_axis.set_title(title)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format=path.suffix.lstrip(".").lower() or "png", dpi=120)
    plt.close(fig)
    return write_atomic(path, image.getvalue())
