#!/usr/bin/env python3
"""Benchmark the graph optimiser: optimisation time (and its growth with graph size) and ONNX Runtime
CPU latency of original vs optimised models, with ORT's own graph optimisations off and on.

    python tools/bench_optimizer.py [--out docs/benchmarks/optimizer.md] [--repeat 30] [--vgg19]

Models: the real topologies shipped in the `onnx` package (trtopt/zoo/light.py; random weights),
models/efficientnet_lite0.onnx when present, and synthetic stacks of ResNet bottleneck + Inception
blocks at 1x and 10x size (linearity). Latency: batch 1, intra_op_num_threads=1, original and optimised
interleaved (tools/benchlib.py) over --repeat rounds after 3 warm-up; medians, and the speed-up as the median
of the rounds' ratios. Writes a markdown table to stdout (and to --out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import emit, header_lines, interleaved, median_seconds  # noqa: E402

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
            sessions = {kind: OrtSession(model, threads=1, opt_level=level)  # type: ignore[arg-type]
                        for kind, model in zip(("original", "optimised"), models, strict=True)}
            calls = {kind: (lambda s=s, f=feeds: s.run(f)) for kind, s in sessions.items()}
            t = interleaved(calls, 3, repeat)
            rows.append(
                f"| {name} | {level} | {t.p50('original'):.2f} ms | {t.p50('optimised'):.2f} ms "
                f"| {t.speedup('optimised'):.2f}x | {result.launches_saved} | {result.bytes_saved / 2**20:.1f} |"
            )
    return rows


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
        *header_lines("tools/bench_optimizer.py", sys.argv[1:] if argv is None else argv,
                      [f"onnx-graphsurgeon {gs.__version__}"]),
    ]
    lines += ["", "### Optimisation time (default passes, median)", ""]
    lines += optimisation_rows({**graphs, **stacks}, max(5, args.repeat // 3))
    lines += ["", "### ONNX Runtime CPU latency, batch 1, 1 thread (median)", ""]
    lines += latency_rows(graphs, args.repeat)
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
