"""Model files, good and bad, written into a test's tmp_path (shared by the front-end and CLI tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from trtopt.zoo import build_model

JPEG_HEADER = bytes([0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10]) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"


def copy(model: onnx.ModelProto) -> onnx.ModelProto:
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    return clone


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def with_opset(version: int) -> onnx.ModelProto:
    model = build_model("resnet_basic")
    model.opset_import[0].version = version
    return model


def unconvertible_scan() -> onnx.ModelProto:
    """A valid opset-8 model (ONNX Runtime runs it) that onnx's version converter cannot take to opset 9+:
    Scan-8 with a sequence_lens input (adapters/scan_8_9.h refuses it)."""
    state, item = (helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [3]) for n in ("s", "i"))
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "i"], ["s2"]), helper.make_node("Identity", ["s2"], ["o"])],
        "body",
        [state, item],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [3]) for n in ("s2", "o")],
    )
    scan = helper.make_node("Scan", ["lens", "s0", "x"], ["sf", "y"], body=body, num_scan_inputs=1)
    graph = helper.make_graph(
        [scan],
        "scan8",
        [
            helper.make_tensor_value_info("lens", onnx.TensorProto.INT64, [1]),
            helper.make_tensor_value_info("s0", onnx.TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 3]),
        ],
        [
            helper.make_tensor_value_info("sf", onnx.TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 4
    return model


def with_custom_op() -> onnx.ModelProto:
    model = build_model("resnet_basic")
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.op_type, relu.domain = "FancyRelu", "com.acme"
    model.opset_import.append(helper.make_opsetid("com.acme", 1))
    return model


def with_misspelled_op() -> onnx.ModelProto:
    model = build_model("resnet_basic")
    next(n for n in model.graph.node if n.op_type == "Conv").op_type = "Convv"
    return model


def with_dynamic_hw(name: str = "tiny_cnn") -> onnx.ModelProto:
    """The zoo model with input dims 2 and 3 (H, W) symbolic (tiny_cnn's output stays 1x10)."""
    model = build_model(name)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    return model


def with_external_location(folder: Path, location: str) -> Path:
    """A model whose first initializer claims to live at `location` (relative to `folder`)."""
    folder.mkdir(exist_ok=True)
    model = build_model("resnet_basic")
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    return save(model, folder / "model.onnx")


def write_bad_file(kind: str, tmp_path: Path) -> Path:
    """Write one kind of bad model into tmp_path and return the path to pass to the loader."""
    writers: dict[str, Callable[[], Path]] = {
        "missing": lambda: tmp_path / "nope.onnx",
        "folder": lambda: tmp_path,
        "empty": lambda: _write(tmp_path / "empty.onnx", b""),
        "jpeg": lambda: _write(tmp_path / "photo.onnx", JPEG_HEADER + bytes(range(256)) * 8),
        "text": lambda: _write(tmp_path / "notes.onnx", b"name,label\ncat.jpg,3\ndog.jpg,5\n"),
        "truncated": lambda: _write(tmp_path / "cut.onnx", _half(build_model("tiny_cnn"))),
        "unconvertible": lambda: save(unconvertible_scan(), tmp_path / "old.onnx"),
        "opset30": lambda: save(with_opset(30), tmp_path / "future.onnx"),
        "custom_op": lambda: save(with_custom_op(), tmp_path / "custom.onnx"),
        "misspelled_op": lambda: save(with_misspelled_op(), tmp_path / "typo.onnx"),
        "escape_relative": lambda: _escape(tmp_path, "../secret.bin"),
        "escape_absolute": lambda: _escape(tmp_path, str(tmp_path / "secret.bin")),
    }
    return writers[kind]()


# What each bad file's message must say (a regex, case-insensitive).
EXPECTED_MESSAGE = {
    "missing": "does not exist",
    "folder": "is a folder",
    "empty": "is empty",
    "jpeg": "not a readable ONNX model",
    "text": "not a readable ONNX model",
    "truncated": "truncated",
    "unconvertible": "opset 8; trtopt works on opsets 11 to 22, and onnx's version converter could not convert it",
    "opset30": "opset 30; trtopt supports opsets 11 to 22.*knows opsets only up to",
    "custom_op": "'FancyRelu' from domain 'com.acme'",
    "misspelled_op": "'Convv'.*did you mean 'Conv'",
    "escape_relative": "not a file name inside the model's folder",
    "escape_absolute": "not a file name inside the model's folder",
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _half(model: onnx.ModelProto) -> bytes:
    data = model.SerializeToString()
    return data[: len(data) // 2]


def _escape(tmp_path: Path, location: str) -> Path:
    """The model in tmp_path/model/, pointing at tmp_path/secret.bin (which exists: the refusal is
    about where it is, not that it is missing)."""
    (tmp_path / "secret.bin").write_bytes(np.ones(16 * 16 * 9, np.float32).tobytes())
    return with_external_location(tmp_path / "model", location)


def tiny_model_with_images(root: Path, count: int, *, model: str = "tiny.onnx", images: str = "images") -> Path:
    """tiny_cnn (seed 1) as `root/model` and `count` smooth random colour fields (closer to photos than white
    noise) as PNGs in `root/images`: the small build every end-to-end test starts from. Returns `root`."""
    from PIL import Image

    onnx.save_model(build_model("tiny_cnn", seed=1), root / model)
    rng = np.random.default_rng(0)
    (root / images).mkdir()
    for i in range(count):
        small = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        Image.fromarray(small).resize((48, 40), Image.BILINEAR).save(root / images / f"img{i:02d}.png")
    return root


def dynamic_batch_tiny_plan(root: Path, labels: list[str] | None = None) -> Path:
    """tiny_cnn with a dynamic batch dimension, built INT8 on the CPU from 8 images: `root/tiny.engine`."""
    from trtopt.build import BuildConfig, build_plan
    from trtopt.data.config import DataConfig
    from trtopt.plan import write_plan

    tiny_model_with_images(root, 8)
    model = onnx.load(root / "tiny.onnx")
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, root / "tiny.onnx")
    data = DataConfig(sources=(str(root / "images"),))
    result = build_plan(root / "tiny.onnx", BuildConfig(backend="cpu", data=data, labels=labels))
    return write_plan(result.plan, root / "tiny.engine")
