"""The export recipes of the corpus, run by tools/corpus.py inside a side environment (tools/corpus_env.py) with
the framework and its exporter; imports nothing of trtopt, and nothing of the frameworks until a recipe runs.

    <env>/bin/python tools/corpus_recipes.py RECIPE OUT.onnx [--source FILE] [ARG ...]

Prints one JSON line: the exporter and framework with their versions and the opset asked for.
Every export takes a dynamic batch dimension, so the same file serves batch 1 and 8.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

RECIPES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {}
TF_OPSET = 13


def recipe(name: str) -> Callable[[Callable[[argparse.Namespace], dict[str, Any]]], Any]:
    def register(fn: Callable[[argparse.Namespace], dict[str, Any]]) -> Any:
        RECIPES[name] = fn
        return fn

    return register


def _tf2onnx_info(framework: str) -> dict[str, Any]:
    return {"exporter": "tf2onnx", "exporter_version": version("tf2onnx"), "framework": framework,
            "framework_version": version("tensorflow-cpu"), "opset": TF_OPSET}


def _without_optimizers(args: argparse.Namespace) -> bool:
    """`raw` as the last recipe argument: tf2onnx with its optimizer pipeline emptied (its transpose optimizer,
    constant folding, identity and back-to-back removal), so that the export keeps the layout work its op
    handlers write: a Transpose pair around every NHWC convolution, the Casts and the shape arithmetic, as
    converters without such a pipeline (keras2onnx, onnx-tf, tflite2onnx) wrote them."""
    if not args.args or args.args[-1] != "raw":
        return False
    from tf2onnx import optimizer

    optimizer._optimizers.clear()  # tf2onnx.optimizer.optimize_graph runs what this table holds
    return True


@recipe("tflite")
def export_tflite(args: argparse.Namespace) -> dict[str, Any]:
    """tf2onnx's TFLite front end (`python -m tf2onnx.convert --tflite`)."""
    import tf2onnx

    raw = _without_optimizers(args)
    tf2onnx.convert.from_tflite(str(args.source), opset=TF_OPSET, output_path=str(args.out))
    return _tf2onnx_info("tflite (TensorFlow Lite flatbuffer)") | {"tf2onnx_optimizers": not raw}


def _export_keras_model(model: Any, out: Path) -> None:
    """Keras's SavedModel export, then tf2onnx's `--saved-model` front end (what its command line runs), in this
    process so that `_without_optimizers` applies."""
    import tempfile

    from tf2onnx import convert

    with tempfile.TemporaryDirectory() as saved:
        model.export(saved, format="tf_saved_model", verbose=False)
        sys.argv = ["tf2onnx.convert", "--saved-model", saved, "--output", str(out), "--opset", str(TF_OPSET)]
        convert.main()


@recipe("keras")
def export_keras_application(args: argparse.Namespace) -> dict[str, Any]:
    """A keras.applications architecture with random weights (weights=None): the real export's graph."""
    import keras

    raw = _without_optimizers(args)
    model = getattr(keras.applications, args.args[0])(weights=None)
    _export_keras_model(model, args.out)
    return {**_tf2onnx_info("keras"), "keras_version": version("keras"), "architecture": args.args[0],
            "tf2onnx_optimizers": not raw}


@recipe("keras-file")
def export_keras_file(args: argparse.Namespace) -> dict[str, Any]:
    """A pretrained Keras model file (.hdf5 / .keras) as a package ships it."""
    import keras

    raw = _without_optimizers(args)
    model = keras.models.load_model(str(args.source), compile=False)
    _export_keras_model(model, args.out)
    return {**_tf2onnx_info("keras"), "keras_version": version("keras"), "tf2onnx_optimizers": not raw}


# torchvision's VisionTransformer at DeiT-Tiny's size (torchvision ships no ViT smaller than ViT-B, 330 MB).
VIT_TINY = dict(image_size=224, patch_size=16, num_layers=12, num_heads=3, hidden_dim=192, mlp_dim=768)


def _logits_only(model: Any) -> Any:
    """torchvision's segmentation models return {"out": logits, ...}; an export wants the logits alone."""
    import torch

    class Out(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(x)["out"]

    return Out(model).eval()


def _torchvision_model(name: str) -> Any:
    import torch
    import torchvision

    torch.manual_seed(0)
    if name.startswith("segmentation."):  # e.g. segmentation.lraspp_mobilenet_v3_large
        build = getattr(torchvision.models.segmentation, name.removeprefix("segmentation."))
        return _logits_only(build(weights=None, weights_backbone=None).eval())
    if name == "vit_tiny":
        model = torchvision.models.VisionTransformer(**VIT_TINY)
        torch.nn.init.normal_(model.heads.head.weight, std=0.05)  # torchvision zero-initialises the head
        return model.eval()
    return getattr(torchvision.models, name)(weights=None).eval()


@recipe("torch-script")
def export_torch_script(args: argparse.Namespace) -> dict[str, Any]:
    """torch.onnx.export with the TorchScript exporter (dynamo=False) at an old opset; a third argument: the input's
    size (224 unless given)."""
    import torch

    arch, opset = args.args[0], int(args.args[1])
    size = int(args.args[2]) if len(args.args) > 2 else 224
    model = _torchvision_model(arch)
    axes = {"input": {0: "N"}, "logits": {0: "N"}}
    torch.onnx.export(model, (torch.randn(1, 3, size, size),), str(args.out), opset_version=opset, dynamo=False,
                      input_names=["input"], output_names=["logits"], dynamic_axes=axes)
    return {"exporter": "torch.onnx (TorchScript)", "exporter_version": version("torch"), "framework": "torchvision",
            "framework_version": version("torchvision"), "opset": opset, "architecture": arch}


@recipe("onnx2torch")
def export_onnx2torch_round_trip(args: argparse.Namespace) -> dict[str, Any]:
    """A torchvision model exported (TorchScript, opset 13), read back by onnx2torch (one torch module per ONNX
    node) and exported again: the round trip that ONNX models fine-tuned in PyTorch go through."""
    import tempfile

    import onnx2torch
    import torch

    arch, opset = args.args[0], int(args.args[1])
    sample = torch.randn(1, 3, 224, 224)
    model = _torchvision_model(arch)
    for layer in model.modules():  # BatchNorm statistics as after training: folded biases all differ (the exporter
        if isinstance(layer, torch.nn.BatchNorm2d):  # writes equal initializers once, behind Identity nodes, which
            layer.running_mean.uniform_(-0.5, 0.5)  # onnx2torch 1.5.15 cannot read: KeyError in conv.py)
            layer.bias.data.uniform_(-0.5, 0.5)
    with tempfile.TemporaryDirectory() as tmp:
        first = Path(tmp, "first.onnx")
        torch.onnx.export(model, (sample,), str(first), opset_version=13, dynamo=False)
        module = onnx2torch.convert(str(first)).eval()
    axes = {"input": {0: "N"}, "logits": {0: "N"}}
    torch.onnx.export(module, (sample,), str(args.out), opset_version=opset, dynamo=False, input_names=["input"],
                      output_names=["logits"], dynamic_axes=axes)
    return {"exporter": "onnx2torch + torch.onnx (TorchScript)", "exporter_version": version("torch"),
            "onnx2torch_version": version("onnx2torch"), "framework": "torchvision",
            "framework_version": version("torchvision"), "opset": opset, "architecture": arch}


@recipe("torch-dynamo")
def export_torch_dynamo(args: argparse.Namespace) -> dict[str, Any]:
    """torch.onnx.export with the dynamo exporter (torch.export + onnxscript)."""
    import torch

    arch, opset = args.args[0], int(args.args[1])
    model = _torchvision_model(arch)
    batch = torch.export.Dim("N", min=1, max=64)
    torch.onnx.export(model, (torch.randn(2, 3, 224, 224),), str(args.out), opset_version=opset, dynamo=True,
                      input_names=["input"], output_names=["logits"], dynamic_shapes=({0: batch},), external_data=False)
    return {"exporter": "torch.onnx (dynamo)", "exporter_version": version("torch"), "framework": "torchvision",
            "framework_version": version("torchvision"), "onnxscript_version": version("onnxscript"), "opset": opset,
            "architecture": arch}


@recipe("paddle")
def export_paddle(args: argparse.Namespace) -> dict[str, Any]:
    """paddle.onnx.export (paddle2onnx) of a paddle.vision architecture with random weights."""
    import paddle

    paddle.seed(0)
    arch = args.args[0]
    model = getattr(paddle.vision.models, arch)()
    model.eval()
    spec = [paddle.static.InputSpec([None, 3, 224, 224], "float32", "input")]
    prefix = str(args.out.with_suffix(""))
    paddle.onnx.export(model, prefix, input_spec=spec, opset_version=TF_OPSET)
    return {"exporter": "paddle2onnx", "exporter_version": version("paddle2onnx"), "framework": "paddlepaddle",
            "framework_version": version("paddlepaddle"), "opset": TF_OPSET, "architecture": arch}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path)
    parser.add_argument("args", nargs="*")
    args = parser.parse_intermixed_args()  # the recipe's arguments may follow --source
    info = RECIPES[args.recipe](args)
    if not args.out.is_file():
        print(f"error: the {args.recipe} recipe wrote no {args.out}", file=sys.stderr)
        return 1
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
