"""Hostile files for tests/test_hostile_*.py: crafted plans, images, models and caches (issue #15)."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from trtopt.plan.format import _PREFIX, FORMAT_VERSION, MAGIC


def sealed_plan(header: dict[str, Any], sections: list[bytes], *, raw_header: bytes | None = None) -> bytes:
    """Plan bytes with a correct overall sha256, as anyone who edits a plan can make them."""
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    body = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(text)) + text + b"".join(sections)
    return body + hashlib.sha256(body).digest()


def split_plan(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """(header, section bytes in order) of a valid plan, to edit and reseal."""
    _, _, length = _PREFIX.unpack_from(data)
    header = json.loads(data[_PREFIX.size : _PREFIX.size + length])
    offset, sections = _PREFIX.size + length, []
    for entry in header["sections"]:
        sections.append(data[offset : offset + entry["size"]])
        offset += entry["size"]
    return header, sections


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims `width` x `height` (a decompression bomb's header) with a tiny, valid-CRC body."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def model_with_if_branch(op: str, domain: str = "") -> onnx.ModelProto:
    """x -> If(max(x) > 100) then <op>(x) else Relu(x): calibration never takes the `then` branch."""
    t = onnx.TensorProto

    def branch(name: str, op_type: str, dom: str) -> onnx.GraphProto:
        node = helper.make_node(op_type, ["x"], [f"{name}_y"], domain=dom)
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(f"{name}_y", t.FLOAT, [1, 4])])

    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "c"], ["b"]),
        helper.make_node("If", ["b"], ["y"], then_branch=branch("then", op, domain),
                         else_branch=branch("else", "Relu", "")),  # fmt: skip
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", t.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", t.FLOAT, [1, 4])],
        initializer=[helper.make_tensor("c", t.FLOAT, [], [100.0])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def relu_model(shape: list[int | str]) -> onnx.ModelProto:
    t = onnx.TensorProto
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", t.FLOAT, shape)], [helper.make_tensor_value_info("y", t.FLOAT, shape)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def model_with_external_data(folder: Path, *, offset: int, length: int) -> Path:
    """x + w, where w lives in `w.bin` at the given (possibly absurd) offset and length."""
    t = onnx.TensorProto
    (folder / "w.bin").write_bytes(b"\x00" * 16)
    weight = helper.make_tensor("w", t.FLOAT, [4], [0.0] * 4)
    weight.ClearField("float_data")
    weight.data_location = t.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", str(offset)), ("length", str(length))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", t.FLOAT, [1, 4])], [helper.make_tensor_value_info("y", t.FLOAT, [1, 4])],
        initializer=[weight],
    )  # fmt: skip
    path = folder / "ext.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def start_service(plan: Path, *, request_timeout: float) -> Any:
    """The README's service example (examples/http_service.py) serving `plan` on a free loopback port, with the
    given REQUEST_TIMEOUT, in a daemon thread; stop it with `shutdown()` and `server_close()`."""
    import importlib.util
    import threading

    import trtopt

    source = Path(__file__).resolve().parents[1] / "examples" / "http_service.py"
    spec = importlib.util.spec_from_file_location(f"http_service_{threading.get_ident()}", source)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.REQUEST_TIMEOUT = request_timeout
    httpd = module.make_server(trtopt.Engine.load(plan), "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
