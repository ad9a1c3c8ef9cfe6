#!/usr/bin/env python3
"""Build torchvision's architectures as a new user would: a check on graphs nobody here tuned for.

    pip install torch torchvision onnxscript      # once, in any environment: export only
    python tools/bench_architectures.py export [--exporter dynamo legacy] [--models NAME ...]
    python tools/bench_architectures.py run [--folder DIR ...]      # trtopt's environment
    python tools/bench_architectures.py report [--out FILE.md]

`export` writes each architecture to ONNX twice: with torch.onnx's default exporter (`dynamo`, torch.export,
opset 18) and with the TorchScript one (`legacy`, opset 13), into $TRTOPT_ZOO_DIR/architectures
(~/.cache/trtopt/zoo/architectures)/<exporter>. `--exporter dynamo-fp16` exports `model.half()` (an FP16 export:
float16 weights, inputs and outputs), `dynamo-opset23` exports at opset 23 (ops newer than trtopt's opset 22);
`run --folder` takes their folders. Pretrained weights cannot be had here (torchvision downloads them), so
the weights are torchvision's random initialisation, with every BatchNorm's statistics set on 32
`calib_data/` photos (train-mode passes with cumulative averages), so that activations have trained-like
scales, and zero-initialised linear layers (ViT's head) drawn from N(0, 0.01²), so that outputs depend on the
input. Fidelity figures on such weights say little about trained models (several of them amplify small
changes far more than trained ones do; docs/holdout.md, round 4); what this run checks is the rest:
- every FP32 build (the graph passes alone) computes what the model does, to float rounding;
- every INT8 build (`trtopt build X --int8 --calib calib_data/`, defaults: auto method, sensitivity search)
  either writes a verified plan or refuses with a message and writes nothing; no traceback, no hang;
- the kernels compute what the plan's Q/DQ graph says (kernels vs reference), and the speed row.

`run` runs `python -m trtopt build` for each model (FP32, then INT8), records the `--json` summaries
in `results.jsonl` beside the models (a rerun skips what is recorded), and `report` writes the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("TRTOPT_ZOO_DIR", Path.home() / ".cache" / "trtopt" / "zoo")) / "architectures"
CALIB = ROOT / "calib_data"
# Small and medium members of every family torchvision ships (classification and segmentation).
MODELS = (
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet", "inception_v3",
    "maxvit_t", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "regnet_x_400mf",
    "regnet_y_400mf", "resnet18", "resnet50", "resnext50_32x4d", "shufflenet_v2_x1_0", "squeezenet1_0",
    "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11_bn", "vit_b_32", "lraspp_mobilenet_v3_large",
    "deeplabv3_mobilenet_v3_large",
)  # fmt: skip
SEGMENTERS = ("lraspp", "deeplab", "fcn")
EXPORTERS = ("dynamo", "legacy", "dynamo-fp16", "dynamo-opset23")
BUILD_TIMEOUT_S = 900


def export(names: list[str], exporters: list[str]) -> int:
    """Write every (architecture, exporter) pair; a failed export prints its reason and the rest go on."""
    import numpy as np
    from PIL import Image

    try:
        import torch
        import torchvision
    except ImportError as exc:
        print(f"export needs torch and torchvision ({exc}): pip install torch torchvision onnxscript", file=sys.stderr)
        return 2

    photos = sorted(p for p in CALIB.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:32]
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)

    def batch(size: int) -> Any:
        rows = [((np.asarray(Image.open(p).convert("RGB").resize((size, size)), np.float32) / 255 - mean) / std)
                .transpose(2, 0, 1) for p in photos]  # fmt: skip
        return torch.from_numpy(np.stack(rows))

    class FirstOutput(torch.nn.Module):  # torchvision's segmenters return {"out": ...}
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(x)["out"]

    failed = 0
    for name in names:
        for exporter in exporters:
            start, out = time.perf_counter(), CACHE / exporter / f"{name}.onnx"
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                model, x = _prepared(torch, torchvision, name, batch)
                model = FirstOutput(model.eval()) if name.startswith(SEGMENTERS) else model.eval()
                with torch.no_grad():
                    if exporter.startswith("dynamo"):
                        half = exporter == "dynamo-fp16"  # an FP16 export: weights, inputs and outputs float16
                        model, sample = (model.half(), x[:1].half()) if half else (model, x[:1])
                        opset = {"opset_version": 23} if exporter == "dynamo-opset23" else {}
                        torch.onnx.export(model, (sample,), str(out), dynamo=True, external_data=False, **opset)
                    else:
                        torch.onnx.export(model, (x[:1],), str(out), dynamo=False, opset_version=13,
                                          input_names=["input"], output_names=["output"])  # fmt: skip
                print(f"exported {exporter}/{name} in {time.perf_counter() - start:.1f}s", flush=True)
            except Exception as exc:  # an architecture the exporter refuses is a row, not the end of the run
                failed += 1
                print(f"not exported {exporter}/{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return 1 if failed == len(names) * len(exporters) else 0


def _prepared(torch: Any, torchvision: Any, name: str, batch: Callable[[int], Any]) -> tuple[Any, Any]:
    """Architecture `name` with seeded random weights, ready to export, and its photo batch: zero-initialised
    linear layers redrawn, BatchNorm statistics taken from the photos (train-mode passes, cumulative averages)."""
    torch.manual_seed(0)  # per model: the same weights whatever else is exported with it
    kwargs: dict[str, Any] = {"weights": None}
    if name in ("inception_v3", "googlenet"):
        kwargs |= {"aux_logits": False, "init_weights": True}
    if name.startswith(SEGMENTERS):
        kwargs["weights_backbone"] = None
    model = torchvision.models.get_model(name, **kwargs)
    x = batch(299 if name == "inception_v3" else 224)
    for module in model.modules():  # ViT's head starts at zero: its logits would be 0 whatever the input
        if isinstance(module, torch.nn.Linear) and not module.weight.any():
            torch.nn.init.normal_(module.weight, std=0.01)
    for module in model.modules():  # BatchNorm statistics from the photos, not 0 / 1
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None
    model.train()
    with torch.no_grad():
        for i in range(0, len(x), 8):
            model(x[i : i + 8])
    return model, x


def build(model: Path, precision: str, plans: Path) -> dict[str, Any]:
    """One `trtopt build --json` of `model`, and what its summary says."""
    args = ["--int8", "--calib", str(CALIB)] if precision == "int8" else []
    out = plans / f"{model.stem}.{precision}.engine"
    command = [sys.executable, "-m", "trtopt", "build", str(model), *args, "-o", str(out), "--json"]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "seconds": BUILD_TIMEOUT_S}
    record: dict[str, Any] = {"rc": done.returncode, "seconds": round(time.perf_counter() - start, 1)}
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        record["error"] = errors[-1] if errors else done.stderr[-600:]
        record["traceback"] = "Traceback" in done.stderr
        return record
    summary = json.loads(done.stdout)
    checked = summary.get("verification") or {}
    return record | {
        "reference_vs_fp32": (checked.get("reference_vs_fp32") or {}).get("cosine"),
        "kernels_vs_reference": (checked.get("kernels_vs_reference") or {}).get("cosine"),
        "kernels": summary.get("onnxruntime_kernels"),
        "float_layers": len(summary.get("float_layers") or {}),
        "searched": len((summary.get("sensitivity") or {}).get("layers") or {}),
        "speed": (summary.get("speed") or {}).get("ratio"),
    }


def run(folders: list[Path]) -> int:
    results = CACHE / "results.jsonl"
    done = {json.loads(line)["model"] for line in results.read_text().splitlines()} if results.exists() else set()
    plans = CACHE / "plans"
    plans.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        for model in sorted(folder.glob("*.onnx")):
            key = f"{folder.name}/{model.stem}"
            if key in done:
                continue
            record = {"model": key, "fp32": build(model, "fp32", plans), "int8": build(model, "int8", plans)}
            print(key, {k: record[k].get("rc") for k in ("fp32", "int8")}, flush=True)
            with results.open("a") as out:
                out.write(json.dumps(record) + "\n")
            for engine in plans.glob(f"{model.stem}.*.engine"):
                engine.unlink()  # the plans are not kept: hundreds of MB
    return 0


def _cell(value: float | None, digits: int = 5) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def report(out: Path | None) -> int:
    results = CACHE / "results.jsonl"
    if not results.exists():
        print(f"no results in {results}: run `python tools/bench_architectures.py run` first", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    lines = [
        "| model | exporter | FP32 build: plan vs model (cos) | INT8 build | INT8 reference vs FP32 (cos) | "
        "kernels vs reference (cos) | INT8 / float convs | float layers (search) | plan / FP32 time |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(rows, key=lambda r: (r["model"].split("/")[1], r["model"].split("/")[0])):
        folder, name = row["model"].split("/")
        fp32, int8 = row["fp32"], row["int8"]
        if int8["rc"] == 0:
            k = int8.get("kernels") or {}
            outcome = f"ok, {int8['seconds']:.0f} s"
            cells = [_cell(int8["reference_vs_fp32"]), _cell(int8["kernels_vs_reference"]),
                     f"{k.get('int8_convs', 0)} / {k.get('float_convs', 0)}",
                     f"{int8['float_layers']} ({int8['searched']})", _cell(int8["speed"], 2)]  # fmt: skip
        else:
            what = "timed out" if int8["rc"] == "timeout" else ("traceback" if int8.get("traceback") else "refused")
            outcome = f"**{what}**, {int8['seconds']:.0f} s"
            cells = ["–"] * 5
        fp32_cell = _cell(fp32.get("reference_vs_fp32"), 7) if fp32["rc"] == 0 else f"**failed**: {fp32.get('error')}"
        lines.append(f"| {name} | {folder} | {fp32_cell} | {outcome} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if out:
        out.write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="export the architectures (needs torch, torchvision, onnxscript)")
    ex.add_argument("--models", nargs="+", default=list(MODELS), help="torchvision model names")
    ex.add_argument("--exporter", nargs="+", choices=EXPORTERS, default=["dynamo", "legacy"],
                    help="dynamo-fp16: model.half() first; dynamo-opset23: opset_version=23")
    ru = sub.add_parser("run", help="build each exported model, FP32 and INT8, and record the summaries")
    ru.add_argument("--folder", nargs="+", type=Path, default=[CACHE / "dynamo", CACHE / "legacy"])
    rep = sub.add_parser("report", help="the results as a markdown table")
    rep.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "export":
        return export(args.models, args.exporter)
    if args.command == "run":
        return run(args.folder)
    return report(args.out)


if __name__ == "__main__":
    sys.exit(main())
