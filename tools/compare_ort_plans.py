#!/usr/bin/env python3
"""Compare quantised ONNX models as ONNX Runtime runs them: what its optimiser made of each, and their speed.

    python tools/compare_ort_plans.py ops MODEL[:engine] ...
    python tools/compare_ort_plans.py time --batch 8 --rounds 11 FP32.onnx NAME=MODEL[:engine] ...

`ops`: each model's graph after ONNX Runtime's optimiser (level all, `optimized_model_filepath`): node count, op
counts, and every QuantizeLinear / DequantizeLinear left standalone (each one a pass over its tensor) with what
writes and reads it. `:engine` opens the model with the session settings trtopt's CPU runner uses
(`trtopt.backend.cpu.builder.DISABLED_OPTIMIZERS`); without it, ONNX Runtime's defaults (its own quantizer's
models). `time`: one intra-op thread, calls interleaved in a rotating order after 2 warm-up rounds, one random
input; per model the median time, and the medians over rounds of the first model's time over its own (speed-up
vs FP32) and of the second's over its own. This is how issue #45's placement differences were found and costed
(docs/exports.md, *Placement against ONNX Runtime's quantizer*).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import interleaved  # noqa: E402

from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS  # noqa: E402


def _session(path: str, engine: bool, optimized: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if optimized:
        options.optimized_model_filepath = optimized
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=DISABLED_OPTIMIZERS if engine else [])  # fmt: skip


def _spec(arg: str) -> tuple[str, bool]:
    path, _, flag = arg.partition(":")
    return path, flag == "engine"


def ops(models: list[str]) -> None:
    for arg in models:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp, "optimized.onnx"))
            _session(*_spec(arg), optimized=out)
            graph = onnx.load(out).graph
        counts = Counter(n.op_type for n in graph.node)
        print(f"{arg}: {len(graph.node)} nodes {dict(sorted(counts.items()))}")
        writer = {o: n.op_type for n in graph.node for o in n.output}
        for node in graph.node:
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                readers = [n.op_type for n in graph.node if node.output[0] in n.input] or ["graph output"]
                print(f"  {node.op_type}: {writer.get(node.input[0], 'graph input')} -> {', '.join(readers)}")


def time_models(fp32: str, models: list[str], batch: int, rounds: int) -> None:
    sessions = {"FP32": _session(fp32, False)}
    for arg in models:
        name, _, spec = arg.partition("=")
        sessions[name] = _session(*_spec(spec))
    first = sessions["FP32"].get_inputs()[0]
    shape = [batch if i == 0 or not isinstance(d, int) else d for i, d in enumerate(first.shape)]
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    calls = {n: (lambda s=s: s.run(None, {s.get_inputs()[0].name: x})) for n, s in sessions.items()}
    ms = interleaved(calls, 2, rounds).ms
    names = list(sessions)
    second = names[1] if len(names) > 1 else names[0]
    for n in names:
        vs_fp32 = statistics.median(a / b for a, b in zip(ms["FP32"], ms[n], strict=True))
        vs_second = statistics.median(a / b for a, b in zip(ms[second], ms[n], strict=True))
        print(f"{n:24s} {statistics.median(ms[n]):9.2f} ms  {vs_fp32:.3f}x FP32's speed  {vs_second:.3f}x {second}'s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ops").add_argument("models", nargs="+")
    timing = sub.add_parser("time")
    timing.add_argument("--batch", type=int, default=1)
    timing.add_argument("--rounds", type=int, default=11)
    timing.add_argument("fp32")
    timing.add_argument("models", nargs="+", help="NAME=MODEL[:engine]")
    args = parser.parse_args(argv)
    if args.command == "ops":
        ops(args.models)
    else:
        time_models(args.fp32, args.models, args.batch, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
