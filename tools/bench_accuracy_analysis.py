#!/usr/bin/env python3
"""Where the INT8 plans' disagreements with FP32 come from, with evidence that uses calibration data only.

    python tools/bench_accuracy_analysis.py [--model models/efficientnet_lite0.onnx] [--calib calib_data]
        [--heldout tests/data/heldout tests/data/heldout_more] [--folds 5] [--count N] [--eval-count N]
        [--methods entropy percentile mse max] [--seed 0] [--out FILE.md]

Three questions, each answered with a table:

1. Which calibration method should be the default? k-fold cross-validation on the calibration photos
   alone: each fold's photos are scored by a plan calibrated on the other folds, so every photo is
   scored once, by a plan that never saw it. Held-out photos are then scored by plans calibrated on all
   calibration photos. Besides top-1 agreement (a photo either flips or not: noisy at a few hundred
   photos) each method gets the mean KL divergence KL(softmax(FP32) || softmax(INT8)) per photo, a
   continuous measure of the whole output's error.
2. Is one method's lead more than chance? Every method against the default, photo by photo over the
   cross-validated and held-out photos together: how many only the default gets right, how many only
   the other, and the exact two-sided McNemar p-value (binomial test on those discordant photos).
3. Weights or activations? The default plan against the same plan with its activation Q/DQ pairs
   removed (INT8 weights, float activations): how much of the error the weights alone cause.

Agreement: the INT8 top-1 class equals FP32's. All plans are trtopt CPU plans (`build_plan`, backend cpu,
defaults otherwise: bias correction on, bounded activations at their maximum) run by ONNX Runtime with
real INT8 kernels; the reference is the original FP32 model in ONNX Runtime. Outputs are taken as logits.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_accuracy import logits, pct, rel_path, wilson  # noqa: E402
from bench_setup import (  # noqa: E402
    CALIB_DIR,
    DEMO_MODEL,
    HELDOUT_DIR,
    HELDOUT_MORE_DIR,
    ModelUnderTest,
    image_dataset,
    resolve_model,
    stacked,
    trtopt_build,
)
from benchlib import emit, header_lines  # noqa: E402

from trtopt.calib import METHODS  # noqa: E402
from trtopt.execution.ort_session import OrtSession  # noqa: E402


@dataclass(frozen=True)
class Errors:
    """Per photo: does INT8 agree with FP32 on the top-1 class, and KL(FP32 || INT8) of the softmax."""

    agree: np.ndarray
    kl: np.ndarray

    @staticmethod
    def of(reference: np.ndarray, test: np.ndarray) -> Errors:
        ref, out = _log_softmax(reference), _log_softmax(test)
        return Errors(reference.argmax(1) == test.argmax(1), (np.exp(ref) * (ref - out)).sum(1))

    def cells(self) -> list[str]:
        n, share = len(self.agree), float(self.agree.mean())
        low, high = wilson(share, n)
        return [f"{pct(share)} ({low * 100:.1f}-{high * 100:.1f}%)", f"{int(self.agree.sum())}/{n}",
                f"{self.kl.mean():.5f}"]


def _log_softmax(values: np.ndarray) -> np.ndarray:
    x = values.astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar test: under "A and B are equally accurate" each discordant photo is a fair
    coin; p = P(a split at least this uneven). McNemar (1947); the exact binomial form."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def plan_model(model: ModelUnderTest, calib: list[str], method: str) -> onnx.ModelProto:
    """trtopt's CPU INT8 plan (its ONNX) calibrated on the files `calib` with `method`."""
    return onnx.load_from_string(trtopt_build(model, calib, None, method)[1])


def without_activation_quantization(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same plan with every activation QuantizeLinear -> DequantizeLinear pair bypassed: weights (and
    int32 biases) stay quantised, activations stay float. Nodes left without a consumer are dropped."""
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    graph = stripped.graph
    constants = {t.name for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    bypass = {}
    for node in graph.node:
        source = producers.get(node.input[0]) if node.input[0] not in constants else None
        if node.op_type == "DequantizeLinear" and source is not None and source.op_type == "QuantizeLinear":
            bypass[node.output[0]] = source.input[0]
    for node in graph.node:
        node.input[:] = [bypass.get(name, name) for name in node.input]
    for output in graph.output:
        output.name = bypass.get(output.name, output.name)
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):  # the graph is topologically sorted: consumers come after producers
        if any(out in needed for out in node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    return stripped


def folds_of(count: int, k: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(count)
    return [np.sort(order[f::k]) for f in range(k)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEMO_MODEL), help="ONNX file or trtopt.zoo name")
    parser.add_argument("--calib", type=Path, default=CALIB_DIR, help="calibration images")
    parser.add_argument("--heldout", type=Path, nargs="+", default=[HELDOUT_DIR, HELDOUT_MORE_DIR],
                        help="held-out image folders (never calibrated on)")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds over the calibration images")
    parser.add_argument("--count", type=int, help="calibration images to use (default: all)")
    parser.add_argument("--eval-count", type=int, help="held-out images per folder (default: all)")
    parser.add_argument("--methods", nargs="+", default=["entropy", "percentile", "mse", "max"],
                        choices=list(METHODS.names()), help="calibration methods; the first is the baseline")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fold assignment")
    parser.add_argument("--batch", type=int, default=8, help="evaluation batch (models with a dynamic batch)")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    if args.folds < 2:
        parser.error("--folds must be at least 2 (each fold is scored by a plan calibrated on the others)")
    return args


@dataclass
class Analysis:
    """Per method: cross-validated and held-out errors; for the baseline, with and without activation Q/DQ."""

    model_name: str
    calib_count: int
    heldout_count: int
    cv: dict[str, Errors]
    held: dict[str, Errors]
    split: dict[str, tuple[Errors, Errors]]  # plan -> (in-sample, held-out)


def analyse(args: argparse.Namespace) -> Analysis:
    with tempfile.TemporaryDirectory(prefix="bench-accuracy-analysis-") as tmp:
        model = resolve_model(args.model, Path(tmp))
        batch = model.static_batch or args.batch
        calib, files = stacked(image_dataset(model, args.calib, args.count))
        if len(calib) < args.folds:
            sys.exit(f"error: {len(calib)} calibration images cannot make {args.folds} folds; lower --folds")
        heldout = np.concatenate([stacked(image_dataset(model, f, args.eval_count))[0] for f in args.heldout])
        fp32 = OrtSession(onnx.load(model.path))
        ref_calib, ref_heldout = logits(fp32, calib, batch), logits(fp32, heldout, batch)

        folds = folds_of(len(calib), args.folds, args.seed)
        cv: dict[str, Errors] = {}
        held: dict[str, Errors] = {}
        plans: dict[str, onnx.ModelProto] = {}
        for method in args.methods:
            out = np.empty_like(ref_calib)
            for fold in folds:
                scored = set(fold.tolist())
                train = [file for i, file in enumerate(files) if i not in scored]
                out[fold] = logits(OrtSession(plan_model(model, train, method)), calib[fold], batch)
            cv[method] = Errors.of(ref_calib, out)
            plans[method] = plan_model(model, list(files), method)
            held[method] = Errors.of(ref_heldout, logits(OrtSession(plans[method]), heldout, batch))
            print(f"{method}: done", file=sys.stderr, flush=True)

        base = args.methods[0]
        full = f"{base} plan (INT8 weights and activations)"  # its held-out errors are `held[base]`: the same run
        split = {full: (Errors.of(ref_calib, logits(OrtSession(plans[base]), calib, batch)), held[base])}
        runner = OrtSession(without_activation_quantization(plans[base]))
        split["same plan, activation Q/DQ removed (INT8 weights only)"] = (
            Errors.of(ref_calib, logits(runner, calib, batch)), Errors.of(ref_heldout, logits(runner, heldout, batch)))
    return Analysis(model.name, len(calib), len(heldout), cv, held, split)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("trtopt").setLevel(logging.WARNING)
    result = analyse(args)
    emit("\n".join(report(args, result, sys.argv[1:] if argv is None else argv)) + "\n", args.out)
    return 0


def report(args: argparse.Namespace, result: Analysis, argv_used: list[str]) -> list[str]:
    base, cv, held = args.methods[0], result.cv, result.held
    lines = [
        "## Accuracy analysis: calibration methods cross-validated, and where the error comes from",
        "",
        *header_lines("tools/bench_accuracy_analysis.py", argv_used),
        f"- model: `{result.model_name}`; calibration: {result.calib_count} images from `{rel_path(args.calib)}` "
        f"in {args.folds} folds (seed {args.seed}); held-out: {result.heldout_count} images from "
        f"{' + '.join(f'`{rel_path(f)}`' for f in args.heldout)}; plans: trtopt CPU INT8, build defaults",
        "",
        "### Cross-validated (calibration photos only) and held-out, per method",
        "",
        f"| method | CV agreement, 95% CI | CV agreed | CV mean KL | held-out agreement, 95% CI | held-out agreed "
        f"| held-out mean KL | only {base} right | only this right | McNemar p |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base_agree = np.concatenate([cv[base].agree, held[base].agree])
    for method in args.methods:
        agree = np.concatenate([cv[method].agree, held[method].agree])
        only_base, only_this = int((base_agree & ~agree).sum()), int((agree & ~base_agree).sum())
        paired = (["–", "–", "–"] if method == base
                  else [str(only_base), str(only_this), f"{mcnemar_p(only_base, only_this):.2f}"])
        lines.append(f"| {method} | " + " | ".join([*cv[method].cells(), *held[method].cells(), *paired]) + " |")
    return lines + _error_split(args, result, len(base_agree))


def _error_split(args: argparse.Namespace, result: Analysis, paired_count: int) -> list[str]:
    base = args.methods[0]
    lines = [
        "",
        f"CV: {args.folds}-fold cross-validation; each calibration photo is scored by a plan calibrated on the "
        f"other folds. Held-out: plans calibrated on all {result.calib_count} calibration photos. KL: mean over "
        "photos of KL(softmax(FP32) || softmax(INT8)) in nats, lower is better. The paired columns count, over "
        f"the CV and held-out photos together ({paired_count}), the photos only {base} or only this method "
        "gets right; McNemar p: the chance of a split at least that uneven if both methods were equally "
        "accurate (exact binomial test).",
        "",
        f"### Where the error comes from ({base})",
        "",
        "| plan | in-sample agreement, 95% CI | in-sample agreed | in-sample mean KL "
        "| held-out agreement, 95% CI | held-out agreed | held-out mean KL |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (on_calib, on_heldout) in result.split.items():
        lines.append(f"| {name} | " + " | ".join([*on_calib.cells(), *on_heldout.cells()]) + " |")
    return lines + [
        "",
        f"Both rows: the {base} plan calibrated on all calibration photos; in-sample: scored on those same "
        "photos. The second row bypasses its activation QuantizeLinear -> DequantizeLinear pairs; weights and "
        "biases stay as quantised (bias correction included). The two errors do not simply add.",
    ]


if __name__ == "__main__":
    sys.exit(main())
