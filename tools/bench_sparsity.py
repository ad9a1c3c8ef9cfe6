#!/usr/bin/env python3
"""2:4 structured sparsity on a real model: the MAC share that could run sparse, and what one-shot magnitude
pruning costs in output fidelity, per layer and within a budget, in FP32 and through an INT8 build.

    python tools/bench_sparsity.py                                   # the demo model, ~2 minutes on one core
    python tools/bench_sparsity.py --model light:resnet50 --sens-count 8 --heldout tests/data/heldout
    python tools/bench_sparsity.py --model zoo:open-nsfw --int8-layers-by-macs 4   # a trained ResNet-50 (zoo cache)

`--model zoo:NAME` takes a model of the real-model zoo (tools/zoo.py) from its cache, with the catalog's
preprocessing, converted to opset 13 as `trtopt build` converts it; where its output is a Softmax, the fidelity is
measured on the logits (the Softmax's input). A model not in the cache gives a section that says so.

Sensitivity and the greedy budget are measured on calibration photos (`--sens-count` of calib_data/), as
`trtopt sparsify --calib --max-loss` does; every fidelity is then checked on held-out photos against the dense
FP32 model. INT8 rows are CPU plans built by `trtopt.build.build_plan` (calibrated on calib_data/) and run by
ONNX Runtime's kernels on this CPU. No fine-tuning happens: these are the costs NVIDIA's ASP workflow recovers by
retraining. No GPU runs here, so no speed-up is measured: that is owed to a GPU run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_setup import (  # noqa: E402
    CALIB_DIR,
    DEMO_MODEL,
    HELDOUT_DIR,
    HELDOUT_MORE_DIR,
    ModelUnderTest,
    image_dataset,
    resolve_model,
    stacked,
)
from benchlib import emit, header_lines, load_average  # noqa: E402

from trtopt.sparsify import Fidelity, FidelityProbe, choose_within_budget, prunable_layers, sensitivities  # noqa: E402
from trtopt.sparsify.prune import prune_report, pruned_weights, with_weights  # noqa: E402

ZOO_PREFIX = "zoo:"


@dataclass
class Row:
    """One variant: which layers are pruned, and its fidelity on the calibration and held-out photos."""

    name: str
    layers: tuple[str, ...]
    calib: Fidelity | None
    heldout: Fidelity
    int8: Fidelity | None = None


def batches_of(images: np.ndarray, model: ModelUnderTest, batch: int) -> list[tuple[dict[str, np.ndarray], int]]:
    size = model.static_batch or batch
    return [({model.input_name: images[i : i + size]}, len(images[i : i + size])) for i in range(0, len(images), size)]


def analyse(model_proto: onnx.ModelProto) -> tuple[Any, dict[str, str], dict[str, int | None], int, dict[str, str]]:
    """(weight sites, reasons, MACs per layer, total MACs, op per layer) of the model's Conv/Gemm/MatMul."""
    from trtopt.analysis import summarize
    from trtopt.frontend import graph_from_onnx
    from trtopt.sparsify import layer_label

    graph = graph_from_onnx(model_proto, fold_constants=False)
    summary = summarize(graph)
    macs = {layer_label(n): c.macs for n, c in zip(graph.nodes, summary.layers, strict=True)}
    sites, reasons = prunable_layers(graph)
    return sites, reasons, macs, summary.macs, {layer_label(n): n.op for n in graph.nodes}


def zoo_model(name: str, workdir: Path) -> tuple[ModelUnderTest, Any] | None:
    """A real-zoo model from its cache (None where it is not there), at opset 13 and cut to its logits, and
    the catalog's preprocessing (a `PreprocessConfig`)."""
    import zoo  # tools/zoo.py

    from trtopt.cli.preprocess_args import add_preprocess_arguments, preprocess_config
    from trtopt.data.samples import preprocess_spec_for
    from trtopt.frontend.loader import load_model
    from trtopt.passes.config import GraphConfig, load_graph

    entry, cached = zoo.model_named(name), zoo.cached_path(name)
    if cached is None:
        return None
    path = workdir / f"{name}.onnx"
    onnx.save_model(logits_model(load_model(cached, min_opset=13).model), path)
    parser = argparse.ArgumentParser(add_help=False)
    add_preprocess_arguments(parser, base="preset")
    preprocess = preprocess_config(parser.parse_args(list(entry.preprocess)))
    model = resolve_model(str(path), workdir)
    graph = load_graph(path, GraphConfig(), int8=False, batch=8)
    return replace(model, name=name, spec=preprocess_spec_for(path, graph, preprocess)), preprocess


def logits_model(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model without a final Softmax: its one output becomes the Softmax's input (the logits)."""
    (output,) = proto.graph.output
    last = [n for n in proto.graph.node if output.name in n.output]
    if len(last) != 1 or last[0].op_type != "Softmax":
        return proto
    proto.graph.node.remove(last[0])
    proto.graph.output.remove(output)
    proto.graph.output.append(onnx.helper.make_tensor_value_info(last[0].input[0], onnx.TensorProto.FLOAT, None))
    return onnx.shape_inference.infer_shapes(proto)


def build_int8(
    proto: onnx.ModelProto, args: argparse.Namespace, workdir: Path, name: str, spec_from: Path, preprocess: Any
) -> Any:
    """A CPU INT8 plan of `model_proto` (calibrated on --calib, preprocessed by `preprocess` or else the model's
    sidecar), as ONNX Runtime runs it on this CPU."""
    from trtopt.backend.cpu.runner import model_for_this_cpu
    from trtopt.build import BuildConfig, build_plan

    path = workdir / f"{name}.onnx"
    onnx.save_model(proto, path)
    sidecar = spec_from.with_suffix(".json")
    if sidecar.is_file():
        path.with_suffix(".json").write_bytes(sidecar.read_bytes())
    from trtopt.calib.config import CalibConfig
    from trtopt.data.config import DataConfig

    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(args.calib),), count=args.int8_count),
                         calib=CalibConfig(threads=args.threads))  # fmt: skip
    if preprocess is not None:
        config = replace(config, preprocess=preprocess)
    plan = build_plan(path, config).plan
    return onnx.load_from_string(model_for_this_cpu(plan))


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def loss(fidelity: Fidelity | None) -> str:
    return "-" if fidelity is None else f"{fidelity.loss:.2e}"


def layer_table(rows: Sequence[Row], report: Any, macs_total: int) -> list[str]:
    stats = {p.name: p for p in report.pruned}
    lines = [
        "| layer | op | weight | MACs | L1 removed | L2 removed | calib 1 - cos | held-out 1 - cos | held-out top-1 | "
        "INT8: held-out 1 - cos | INT8: held-out top-1 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        (layer,) = row.layers
        s = stats[layer]
        lines.append(
            f"| `{layer}` | {s.op} | {'x'.join(map(str, s.shape))} | {pct((s.macs or 0) / macs_total)} | "
            f"{pct(s.l1_removed)} | {pct(s.l2_removed)} | {loss(row.calib)} | {loss(row.heldout)} | "
            f"{pct(row.heldout.top1)} | {loss(row.int8)} | {pct(row.int8.top1 if row.int8 else None)} |"
        )
    return lines


def budget_table(rows: Sequence[Row], macs: Mapping[str, int | None], macs_total: int, eligible: int) -> list[str]:
    lines = [
        "| variant | layers pruned | MACs pruned | calib 1 - cos | held-out 1 - cos | held-out top-1 | "
        "INT8: held-out 1 - cos | INT8: held-out top-1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        share = sum(macs[x] or 0 for x in row.layers) / macs_total
        int8 = row.int8
        lines.append(
            f"| {row.name} | {len(row.layers)} of {eligible} | {pct(share)} | {loss(row.calib)} | "
            f"{loss(row.heldout)} | {pct(row.heldout.top1)} | {loss(int8)} | {pct(int8.top1 if int8 else None)} |"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEMO_MODEL), help="ONNX path, zoo name or light:NAME")
    parser.add_argument("--calib", type=Path, default=CALIB_DIR)
    parser.add_argument("--sens-count", type=int, default=32, help="calibration photos for sensitivity and budget")
    parser.add_argument("--int8-count", type=int, default=None, help="calibration photos for INT8 (default all)")
    parser.add_argument("--heldout", type=Path, nargs="+", default=[HELDOUT_DIR, HELDOUT_MORE_DIR])
    parser.add_argument("--eval-count", type=int, default=None, help="held-out photos per folder (default all)")
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.005, 0.02], help="1 - cosine budgets")
    parser.add_argument("--top", type=int, default=3, help="most and least sensitive layers to list")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--no-int8", action="store_true", help="skip the INT8 builds")
    parser.add_argument("--no-int8-layers", action="store_true", help="INT8 builds for the budget rows only")
    parser.add_argument("--int8-layers-by-macs", type=int, default=0, metavar="N",
                        help="also list the N eligible layers of largest MAC share, each pruned alone, FP32 and INT8 "
                        "(an INT8 build each)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown section here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before, start, cpu_start = load_average(), time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="bench-sparsity-") as tmp:
        resolved = subject(args.model, Path(tmp))
        if resolved is None:
            emit(skipped(args, argv), args.out)
            return 0
        model, preprocess = resolved
        proto = onnx.load(model.path)
        sites, reasons, macs, macs_total, ops = analyse(proto)
        variable = [site.name for site in sites.values()]
        sens_images, _ = stacked(image_dataset(model, args.calib, args.sens_count))
        heldout = [stacked(image_dataset(model, folder, args.eval_count))[0] for folder in args.heldout]
        heldout_images = np.concatenate(heldout)
        calib_probe = FidelityProbe(proto, batches_of(sens_images, model, args.batch), threads=args.threads,
                                    variable=variable)  # fmt: skip
        heldout_probe = FidelityProbe(proto, batches_of(heldout_images, model, args.batch), threads=args.threads,
                                      variable=variable)  # fmt: skip
        each = {layer: pruned_weights(sites, [layer]) for layer in sites}
        t0 = time.perf_counter()
        single = sensitivities(each, calib_probe)
        sens_seconds = time.perf_counter() - t0
        order = sorted(single, key=lambda layer: (single[layer].loss, layer))
        picks = [*order[: args.top], *order[-args.top :][::-1]] if len(order) > 2 * args.top else order
        layer_rows = [Row(x, (x,), single[x], heldout_probe.measure_weights(each[x])) for x in picks]
        largest = sorted(single, key=lambda layer: (-(macs[layer] or 0), layer))[: args.int8_layers_by_macs]
        mac_rows = [Row(x, (x,), single[x], heldout_probe.measure_weights(each[x])) for x in largest]
        budget_rows = variants(args, each, single, calib_probe, heldout_probe, order, sites)
        int8_rows = [] if args.no_int8 else budget_rows + ([] if args.no_int8_layers else layer_rows) + mac_rows
        t0 = time.perf_counter()
        for i, row in enumerate(int8_rows):
            print(f"INT8 build {i + 1} of {len(int8_rows)}: {row.name}", file=sys.stderr, flush=True)
            int8_model = build_int8(with_weights(proto, pruned_weights(sites, row.layers)), args, Path(tmp),
                                    f"v{i}", model.path, preprocess)  # fmt: skip
            row.int8 = heldout_probe.measure(int8_model)
        build_seconds = (time.perf_counter() - t0) / max(len(int8_rows), 1)
    report = prune_report(sites, list(sites), reasons, ops, macs)
    text = section(args, argv, model, report, reasons, macs, macs_total, layer_rows, budget_rows, single, heldout)
    text += mac_section(args, mac_rows, report, macs_total, build_seconds)
    seconds = (time.perf_counter() - start, time.process_time() - cpu_start)
    text += timing(load_before, seconds, sens_seconds, len(sites), len(sens_images))
    emit(text, args.out)
    return 0


def subject(name: str, workdir: Path) -> tuple[ModelUnderTest, Any] | None:
    """The model and the preprocessing its INT8 builds take (None: its sidecar's); None for a zoo model that
    is not in the cache."""
    if name.startswith(ZOO_PREFIX):
        return zoo_model(name.removeprefix(ZOO_PREFIX), workdir)
    return resolve_model(name, workdir), None


def skipped(args: argparse.Namespace, argv: list[str] | None) -> str:
    name = args.model.removeprefix(ZOO_PREFIX)
    return "\n".join([
        f"## 2:4 structured sparsity: `{name}`", "",
        *header_lines("tools/bench_sparsity.py", sys.argv[1:] if argv is None else argv), "",
        f"**Skipped: `{name}` is not in the zoo cache** (`python tools/zoo.py list` shows what is); nothing was "
        f"measured. Fetch it with `python tools/zoo.py fetch {name}` and run the command again.",
    ]) + "\n"  # fmt: skip


def mac_section(args: argparse.Namespace, rows: list[Row], report: Any, macs_total: int, build_seconds: float) -> str:
    """The layers of largest MAC share, each pruned alone (FP32 and INT8), where --int8-layers-by-macs asks."""
    if not rows:
        return ""
    share = sum(s.macs or 0 for s in report.pruned if s.name in {r.layers[0] for r in rows}) / macs_total
    lines = [
        "",
        f"### The {len(rows)} eligible layers of largest MAC share (ties by name), each pruned alone (FP32 and INT8)",
        "",
        *layer_table(rows, report, macs_total),
        "",
        f"Together they carry {pct(share)} of the MACs. An INT8 build calibrates and verifies a whole plan ("
        f"{build_seconds:.0f} s wall each here, with its held-out run), so the INT8 columns of the per-layer tables "
        "cover these layers" + ("" if args.no_int8_layers else " and the least and most sensitive ones")
        + ", not every eligible layer.",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def variants(
    args: argparse.Namespace, each: Any, single: Mapping[str, Fidelity], calib_probe: FidelityProbe,
    heldout_probe: FidelityProbe, order: Sequence[str], sites: Any,
) -> list[Row]:  # fmt: skip
    """Dense, the greedy choice within each budget, and every eligible layer pruned."""
    rows = [Row("dense", (), None, heldout_probe.measure_weights({}))]
    for budget in args.budgets:
        choice = choose_within_budget(each, single, calib_probe, budget)
        weights = pruned_weights(sites, choice.chosen)
        rows.append(Row(f"budget 1 - cos <= {budget:g}", choice.chosen, choice.fidelity,
                        heldout_probe.measure_weights(weights)))  # fmt: skip
    everything = pruned_weights(sites, order)
    rows.append(Row("every eligible layer", tuple(order), calib_probe.measure_weights(everything),
                    heldout_probe.measure_weights(everything)))  # fmt: skip
    return rows


def section(
    args: argparse.Namespace, argv: list[str] | None, model: ModelUnderTest, report: Any, reasons: Mapping[str, str],
    macs: Mapping[str, int | None], macs_total: int, layer_rows: list[Row], budget_rows: list[Row],
    single: Mapping[str, Fidelity], heldout: list[np.ndarray],
) -> str:  # fmt: skip
    eligible = len(report.pruned)
    eligible_share = sum(p.macs or 0 for p in report.pruned) / macs_total
    sens = sorted(f.loss for f in single.values())
    random_weights = args.model.startswith("light:")
    lines = [
        f"## 2:4 structured sparsity: `{model.name}`",
        "",
        *header_lines("tools/bench_sparsity.py", sys.argv[1:] if argv is None else argv),
        model_line(args.model, model.name, random_weights),
        f"- sensitivity and budget measured on the first {args.sens_count} photos of `{args.calib.name}/`; held-out: "
        + " + ".join(f"`{f.name}` ({len(h)})" for f, h in zip(args.heldout, heldout, strict=True))
        + f" photos; INT8: CPU plans calibrated on `{args.calib.name}/`"
        + (f" (first {args.int8_count})" if args.int8_count else "") + ", run by ONNX Runtime's kernels on this CPU",
        "",
        "### What could run sparse",
        "",
        f"{eligible} of {eligible + len(reasons)} Conv/Gemm/MatMul layers are eligible for TensorRT's 2:4 sparse "
        f"kernels (weights grouped along the input channels, a multiple of 4 of them; `trtopt inspect` cites NVIDIA "
        f"for the rule); they carry **{pct(eligible_share)} of the model's {macs_total / 1e9:.2f} GMACs**. Not "
        f"eligible: {_reason_counts(reasons)}. Whether TensorRT runs them faster, and by how much, is measured only "
        "on an Ampere-or-newer GPU: **the GPU speed-up is owed to a GPU run**; none has happened.",
        "",
        f"### Each eligible layer pruned alone (FP32): the {min(args.top, len(layer_rows))} least and most sensitive",
        "",
        *layer_table(layer_rows, report, macs_total),
        "",
        f"Sensitivity over all {len(sens)} eligible layers (1 - cosine on the calibration photos): min "
        f"{sens[0]:.2e}, median {sens[len(sens) // 2]:.2e}, max {sens[-1]:.2e}." if sens else "",
        "",
        "### Pruned together: the greedy budget, and everything",
        "",
        *budget_table(budget_rows, macs, macs_total, eligible),
        "",
        "1 - cos: one minus the cosine similarity of the logits with the dense FP32 model's over all photos (the "
        "budget unit of `trtopt sparsify --max-loss`); top-1: share of photos whose top class is the dense FP32 "
        "model's. Budget rows: layers taken from the least sensitive up, the longest such prefix whose measured "
        "1 - cos on the calibration photos stays within the budget. INT8 columns: the same pruned model built to a "
        "CPU INT8 plan and compared with the *dense FP32* model, so they add the quantisation cost (the dense row "
        "shows it alone). Pruning is one-shot magnitude pruning without fine-tuning: NVIDIA's ASP workflow recovers "
        "accuracy by retraining, which trtopt does not do.",
    ]
    if random_weights:
        lines += ["", "Random weights: this network predicts a few classes for every photo, so its top-1 agreement "
                  "says little, and a trained ResNet-50's sensitivities differ; the cosine columns show how pruning "
                  "error propagates through this topology and INT8, not what a trained model would lose."]  # fmt: skip
    return "\n".join(lines) + "\n"


def model_line(name: str, shown: str, random_weights: bool) -> str:
    if random_weights:
        topology = "the onnx package's ResNet-50 topology with **random He-initialised weights**: see below"
        return f"- model: `{shown}` ({topology})"
    if not name.startswith(ZOO_PREFIX):
        return f"- model: `{shown}`"
    import zoo  # tools/zoo.py

    entry = zoo.model_named(shown)
    return (
        f"- model: `{shown}` from the real-model zoo ({entry.package} {entry.version}, {entry.licence}; **trained**: "
        f"{entry.notes.rstrip('.')}; {entry.exercises}), converted to opset 13 as `trtopt build` does; preprocessed "
        f"with the catalog's `{' '.join(entry.preprocess)}`; fidelity measured on its logits (the final Softmax's "
        f"input), so top-1 says whether a photo's verdict stays the dense model's (with two classes it seldom moves: "
        f"the 1 - cos columns carry the cost)"
    )


def _reason_counts(reasons: Mapping[str, str]) -> str:
    counts: dict[str, int] = {}
    for reason in reasons.values():
        key = "channels not a multiple of 4" if "multiple" in reason else reason
        key = "depthwise" if "depthwise" in reason else key
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} ({why})" for why, n in counts.items()) or "none"


def timing(load_before: str, seconds: tuple[float, float], sens_seconds: float, layers: int, images: int) -> str:
    """Wall and CPU time: on a shared machine the wall time grows with the load, the CPU time much less."""
    return (
        f"\nWall time {seconds[0]:.0f} s, CPU time {seconds[1]:.0f} s ({layers} sensitivities on {images} photos: "
        f"{sens_seconds:.0f} s wall); 1-minute load average {load_before} before, {load_average()} after.\n"
    )


if __name__ == "__main__":
    sys.exit(main())
