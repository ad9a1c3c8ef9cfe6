#!/usr/bin/env python3
"""Where trtopt's CPU plan of a ResNet-50 spends its time against ONNX Runtime's own quantizer (issue #45).

    python tools/bench_cpu_placement.py [--calib calib_data] [--count 32] [--batches 1 8] [--rounds 9]
        [--inception] [--out FILE.md]

The model is a clean ResNet-50 in the form a Keras export takes (residual `Add`, `GlobalAveragePool`, `Gemm`):
the onnx package's light ResNet-50 (trtopt.zoo.light, seeded random weights) with its Caffe2 `Sum`s written as
`Add` and its 7x7 `AveragePool` as `GlobalAveragePool`. Every variant changes one thing, so each row's cost
can be read against its neighbour's:

- ONNX Runtime's quantize_static (QDQ, per-channel int8 weights, uint8 activations, after quant_pre_process)
  as written (u8s8), with its weights stored as uint8 (u8u8: the same values, `store_unsigned_weights`), and
  with `reduce_range` (7-bit weights);
- trtopt's plan in each encoding (u8s8 forced, u8u8, and the default: u8s8p where u8s8 saturates), with every
  conv INT8 (`min_channels=1`: the stem too) (its tail, the last residual Add and the GlobalAveragePool, is
  quantised by default since `QuantConfig.integer_pools`; the row that inserted it by hand is gone);
- trtopt's plan opened with ONNX Runtime's session defaults (no transformers disabled): the runner's options.

Each row gives the kernels ONNX Runtime made of the graph (INT8 convs, float convs, Q and DQ nodes, float
Relus left), the speed-up over FP32 at each batch size (median over rounds of FP32 ms / variant ms, timed in
the same round, one intra-op thread, the order rotating each round), and the fidelity on the held-out photos
(tests/data/heldout): the mean over photos of the cosine between the variant's logits and FP32's, as this CPU
computes them (u8s8 on a CPU without VNNI saturates: that row's fidelity shows it). `--inception` adds
GoogLeNet (light:inception_v1) built with and without the `fuse_parallel_convs` pass.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_setup import CALIB_DIR, HELDOUT_DIR, image_dataset, ort_build, resolve_model, stacked  # noqa: E402
from benchlib import emit, header_lines, interleaved  # noqa: E402

from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS, kernel_report  # noqa: E402
from trtopt.backend.cpu.lowering import store_unsigned_weights  # noqa: E402
from trtopt.execution.ort_session import session_options  # noqa: E402

FP32 = "FP32"


@dataclass
class Variant:
    name: str
    model: bytes
    note: str
    disabled: tuple[str, ...] = tuple(DISABLED_OPTIMIZERS)  # ONNX Runtime transformers switched off


def keras_style_resnet50(path: Path) -> Path:
    """light:resnet50 with Add for Sum and GlobalAveragePool for its final 7x7 AveragePool (see the module)."""
    from trtopt.zoo.light import light_model

    model = light_model("resnet50", dynamic_batch=True)
    for node in model.graph.node:
        if node.op_type == "Sum" and len(node.input) == 2:
            node.op_type = "Add"
        elif node.op_type == "AveragePool":
            node.op_type = "GlobalAveragePool"
            del node.attribute[:]
    onnx.save_model(model, path)
    return path


def trtopt_plan(path: Path, args: argparse.Namespace, encoding: str, **quant: object) -> bytes:
    """trtopt's CPU build of `path` (entropy calibration on --count photos), the plan's ONNX as stored."""
    from trtopt.backend.cpu.options import CpuOptions
    from trtopt.build import BuildConfig, build_plan
    from trtopt.data import DataConfig
    from trtopt.passes.config import GraphConfig
    from trtopt.quant import QuantConfig

    passes = quant.pop("passes", None)
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(args.calib),), count=args.count),
                         quant=replace(QuantConfig(), **quant), graph=GraphConfig(passes=passes),  # type: ignore[arg-type]
                         backend_options=(CpuOptions(encoding=encoding, fallback="off"),))  # fmt: skip
    return build_plan(path, config).plan.sections["onnx"]


def variants(path: Path, args: argparse.Namespace) -> list[Variant]:
    """Every variant of the module docstring, built here."""
    ort_u8s8 = ort_build(resolve_model(str(path), path.parent), str(args.calib), args.count, "minmax")[1]
    ort_rr = ort_build(resolve_model(str(path), path.parent), str(args.calib), args.count, "minmax", True, True)[1]
    plan_u8s8 = trtopt_plan(path, args, "u8s8")
    out = [
        Variant("ORT quantize_static (u8s8)", ort_u8s8, "as written", ()),
        Variant("ORT, weights as u8u8", _unsigned(ort_u8s8), "store_unsigned_weights on ORT's graph", ()),
        Variant("ORT, reduce_range", ort_rr, "7-bit weights", ()),
        Variant("trtopt (u8s8)", plan_u8s8, "--cpu-encoding u8s8"),
        Variant("trtopt (u8u8)", trtopt_plan(path, args, "u8u8"), "--cpu-encoding u8u8"),
        Variant(f"trtopt default ({_auto_encoding()})", trtopt_plan(path, args, "auto"), "--cpu-encoding auto"),
        Variant("trtopt (u8s8), INT8 stem", trtopt_plan(path, args, "u8s8", min_channels=1), "--min-channels 1"),
        Variant("trtopt (u8s8), ORT's session defaults", plan_u8s8, "no transformer disabled", ()),
    ]
    return out


def _auto_encoding() -> str:
    """The encoding `--cpu-encoding auto` takes on this CPU (u8s7 where u8s8 kernels saturate, else u8s8)."""
    from trtopt.backend.cpu.builder import candidate_encodings

    return candidate_encodings("auto")[0]


def _unsigned(model: bytes) -> bytes:
    proto = onnx.load_from_string(model)
    store_unsigned_weights(proto)
    return proto.SerializeToString()


def session(model: bytes, disabled: tuple[str, ...] = ()) -> ort.InferenceSession:
    return ort.InferenceSession(model, session_options(threads=1), providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))  # fmt: skip


def kernels(variant: Variant) -> str:
    ops = kernel_report(variant.model).ops
    return (f"{ops.get('QLinearConv', 0)} / {ops.get('Conv', 0) + ops.get('FusedConv', 0)} / "
            f"{ops.get('QuantizeLinear', 0)} / {ops.get('DequantizeLinear', 0)} / {ops.get('Relu', 0)}")  # fmt: skip


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over samples of the cosine between rows of `a` and `b`."""
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return float(np.mean((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def measure(models: dict[str, Variant], feed: str, photos: np.ndarray, args: argparse.Namespace) -> list[str]:
    """One markdown row per model: kernels, speed-ups per batch size, cosine to FP32 on `photos`."""
    sessions = {name: session(v.model, v.disabled) for name, v in models.items()}
    expected = sessions[FP32].run(None, {feed: photos})[0]
    fidelity = {name: cosine(s.run(None, {feed: photos})[0], expected) for name, s in sessions.items()}
    per_batch = []
    for batch in args.batches:
        x = np.resize(photos, (batch, *photos.shape[1:]))
        calls = {name: (lambda s=s, x=x: s.run(None, {feed: x})) for name, s in sessions.items()}
        timings = interleaved(calls, 1, args.rounds)
        per_batch.append({name: timings.speedup(name) for name in calls})
    rows = []
    for name, v in models.items():
        speed = " / ".join(f"{r[name]:.2f}x" for r in per_batch)
        rows.append(f"| {name} | {kernels(v)} | {speed} | {fidelity[name]:.5f} | {v.note} |")
    return rows


def inception_rows(args: argparse.Namespace, workdir: Path, photos_dir: Path) -> list[str]:
    """GoogLeNet's plan built with and without fuse_parallel_convs (trtopt's u8u8 or auto encoding)."""
    from trtopt.passes.pipeline import DEFAULT_ORDER

    model = resolve_model("light:inception_v1", workdir)
    photos, _ = stacked(image_dataset(model, photos_dir, 8))
    without = tuple(p for p in DEFAULT_ORDER if p != "fuse_parallel_convs")
    models = {
        FP32: Variant(FP32, model.path.read_bytes(), "", ()),
        "trtopt, all passes": Variant(
            "", trtopt_plan(model.path, args, "auto", passes=DEFAULT_ORDER), "default pass list"
        ),  # fmt: skip
        "trtopt, no fuse_parallel_convs": Variant(
            "", trtopt_plan(model.path, args, "auto", passes=without), "fuse_parallel_convs left out"
        ),  # fmt: skip
    }
    return measure(models, model.input_name, photos, args)


HEAD = ["| variant | INT8 convs / float convs / Q / DQ / Relu (after ORT's optimiser) | speed-up vs FP32 {b} | "
        "cosine to FP32 | what |", "|---|---|---:|---:|---|"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calib", type=Path, default=CALIB_DIR)
    parser.add_argument("--heldout", type=Path, default=HELDOUT_DIR, help="photos for the fidelity column")
    parser.add_argument("--count", type=int, default=32, help="calibration photos per build")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per batch size")
    parser.add_argument("--inception", action="store_true", help="also GoogLeNet with/without fuse_parallel_convs")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    head = [HEAD[0].format(b="(b" + " / b".join(map(str, args.batches)) + ")"), HEAD[1]]
    with tempfile.TemporaryDirectory(prefix="bench-placement-") as tmp:
        path = keras_style_resnet50(Path(tmp, "resnet50_keras_style.onnx"))
        model = resolve_model(str(path), Path(tmp))
        photos, _ = stacked(image_dataset(model, args.heldout, 8))
        models = {FP32: Variant(FP32, path.read_bytes(), "", ())}
        models |= {v.name: v for v in variants(path, args)}
        rows = measure(models, model.input_name, photos, args)
        extra = inception_rows(args, Path(tmp), args.heldout) if args.inception else []
    lines = ["## CPU plans: placement against ONNX Runtime's quantizer (ResNet-50)", "",
             *header_lines("tools/bench_cpu_placement.py", sys.argv[1:] if argv is None else argv), "",
             *head, *rows]  # fmt: skip
    if extra:
        lines += ["", "GoogLeNet (light:inception_v1), trtopt's default encoding on this CPU:", "", *head, *extra]
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
