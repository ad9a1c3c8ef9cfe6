#!/usr/bin/env python3
"""Benchmark the graph optimiser: optimisation time (and its growth with graph size) and ONNX Runtime
CPU latency of original vs optimised models, with ORT's own graph optimisations off and on.

    python tools/bench_optimizer.py [--out docs/benchmarks/optimizer.md] [--repeat 30] [--vgg19]

Models: the real topologies shipped in the `onnx` package (trtopt/zoo/light.py; random weights),
models/efficientnet_lite0.onnx when present, and synthetic stacks of ResNet bottleneck + Inception
blocks at 1x and 10x size (linearity). Latency: batch 1, intra_op_num_threads=1, median of --repeat
runs after warm-up. Writes a markdown table to stdout (and to --out).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_setup import cpu_class  # noqa: E402

from trtopt.execution.ort_session import OrtSession  # noqa: E402
from trtopt.frontend import graph_from_onnx, onnx_from_graph  # noqa: E402
from trtopt.passes import optimize  # noqa: E402
from trtopt.zoo import GraphBuilder  # noqa: E402
from trtopt.zoo.inception import inception_block  # noqa: E402
from trtopt.zoo.light import LIGHT_NAMES, light_model  # noqa: E402
from trtopt.zoo.resnet import bottleneck_block  # noqa: E402


def stacked_model(blocks: int) -> onnx.ModelProto:
    """`blocks` x (bottleneck block + inception block) on a 24x8x8 map: ~27 nodes per block."""
    b = GraphBuilder(f"stack{blocks}", seed=0, opset=17)
    y = b.conv_bn(b.input("input", [1, 24, 8, 8]), 24, 24, 3)
    for _ in range(blocks):
        y = bottleneck_block(b, y, 24, 8, 24, stride=1)
        y = inception_block(b, y, 24, (8, 8, 8, 4, 4, 4))
    return b.build([y])


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()  # a collection triggered mid-run by earlier garbage would be charged to this run
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def optimisation_rows(graphs: dict[str, gs.Graph], repeat: int) -> list[str]:
    rows = [
        "| graph | nodes before | nodes after | optimise (median) | per node |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, graph in graphs.items():
        result = optimize(graph)
        seconds = median_seconds(lambda g=graph: optimize(g), repeat)
        rows.append(
            f"| {name} | {result.nodes_before} | {result.nodes_after} | {seconds * 1e3:.1f} ms "
            f"| {seconds / result.nodes_before * 1e6:.0f} µs |"
        )
    return rows


def latency_rows(graphs: dict[str, gs.Graph], repeat: int) -> list[str]:
    rows = [
        "| model | ORT opt | original | optimised | speed-up | est. launches saved | interm. MiB saved |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, graph in graphs.items():
        result = optimize(graph)
        feeds = {
            t.name: np.random.default_rng(0).standard_normal(t.shape).astype(np.float32) for t in graph.inputs
        }
        models = (onnx_from_graph(graph), onnx_from_graph(result.graph))
        for level in ("disable", "all"):
            ms = []
            for model in models:
                session = OrtSession(model, threads=1, opt_level=level)  # type: ignore[arg-type]
                for _ in range(3):
                    session.run(feeds)
                ms.append(median_seconds(lambda s=session, f=feeds: s.run(f), repeat) * 1e3)
            rows.append(
                f"| {name} | {level} | {ms[0]:.2f} ms | {ms[1]:.2f} ms | {ms[0] / ms[1]:.2f}x "
                f"| {result.launches_saved} | {result.bytes_saved / 2**20:.1f} |"
            )
    return rows


def machine_lines(argv: list[str]) -> list[str]:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu = next(
            (
                l.split(":", 1)[1].strip()
                for l in cpuinfo.read_text().splitlines()
                if l.startswith("model name")
            ),
            cpu,
        )
    import os

    return [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- machine: {cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}; {cpu_class()}",
        f"- versions: Python {platform.python_version()}, onnx {onnx.__version__}, "
        f"onnxruntime {ort.__version__}, onnx-graphsurgeon {gs.__version__}, numpy {np.__version__}",
        f"- command: `python {' '.join(argv)}`",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per measurement (median)")
    parser.add_argument(
        "--vgg19", action="store_true", help="include VGG-19 (550 MB of weights, slow to load)"
    )
    args = parser.parse_args(argv)

    names = [n for n in LIGHT_NAMES if n != "vgg19" or args.vgg19]
    graphs = {name: graph_from_onnx(light_model(name)) for name in names}
    effnet = ROOT / "models" / "efficientnet_lite0.onnx"
    if effnet.exists():
        graphs["efficientnet_lite0"] = graph_from_onnx(effnet, shapes={"input": (1, 3, 224, 224)})
    stacks = {f"stack x{k} (synthetic)": graph_from_onnx(stacked_model(k)) for k in (8, 80)}

    lines = [
        "## Graph optimiser",
        "",
        *machine_lines(sys.argv if argv is None else ["tools/bench_optimizer.py", *argv]),
    ]
    lines += ["", "### Optimisation time (default passes, median)", ""]
    lines += optimisation_rows({**graphs, **stacks}, max(5, args.repeat // 3))
    lines += ["", "### ONNX Runtime CPU latency, batch 1, 1 thread (median)", ""]
    lines += latency_rows(graphs, args.repeat)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
