"""The Python-backend model (trtopt/serving/triton/python_model.py) against a stand-in for Triton's
`triton_python_backend_utils`: the batching of grouped requests, images and tensors, per-request errors.
tests/test_triton_server.py runs the same model inside a real server."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
from model_files import dynamic_batch_tiny_plan

import trtopt
from trtopt.serving.triton import TritonOptions, export_triton
from trtopt.serving.triton.python_model import TritonPythonModel


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class Response:
    def __init__(self, output_tensors: list[Tensor], error: str | None = None) -> None:
        self.outputs = {t.name: t.array for t in output_tensors}
        self.error = error


def stand_in_pb_utils() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        Tensor=Tensor,
        InferenceResponse=Response,
        TritonError=lambda message: message,
        get_input_tensor_by_name=lambda request, name: Tensor(name, request[name]) if name in request else None,
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("py")
    dynamic_batch_tiny_plan(root)
    export_triton(root / "tiny.engine", root / "repo", TritonOptions(threads=1))
    folder = root / "repo" / "tiny"
    config = json.loads(json.dumps(_as_json_config(folder)))
    model = TritonPythonModel()
    model.configure(
        {"model_config": json.dumps(config), "model_repository": str(folder), "model_version": "1",
         "model_instance_kind": "CPU"},
        stand_in_pb_utils(),
    )  # fmt: skip
    engine = trtopt.Engine.load(root / "tiny.engine", threads=1)
    yield model, engine, root
    model.finalize()
    engine.close()


def _as_json_config(folder: Path) -> dict:
    """The JSON form Triton hands to initialize(): parameters as a map, enums as names."""
    from trtopt.serving.triton.config import REPEATED
    from trtopt.serving.triton.pbtxt import Enum, dict_from_pbtxt

    config = dict_from_pbtxt((folder / "config.pbtxt").read_text(), REPEATED)

    def plain(value):  # type: ignore[no-untyped-def]
        if isinstance(value, Enum):
            return value.name
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    config = plain(config)
    config["parameters"] = {p["key"]: p["value"] for p in config.get("parameters", [])}
    return config


def images(root: Path, names: list[str]) -> np.ndarray:
    return np.array([[(root / "images" / n).read_bytes()] for n in names], dtype=object)


def test_grouped_requests_run_as_one_batch_and_answer_like_the_engine(served) -> None:  # type: ignore[no-untyped-def]
    model, engine, root = served
    calls = []
    infer = model.engine.infer
    model.engine.infer = lambda feeds: calls.append(len(feeds["input"])) or infer(feeds)
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32)
    requests = [
        {"IMAGE": images(root, ["img00.png", "img01.png"])},
        {"input": x},
        {"IMAGE": images(root, ["img02.png"])},
    ]
    try:
        responses = model.execute(requests)
    finally:
        model.engine.infer = infer
    assert calls == [6]  # one Engine call for the three requests
    assert [r.error for r in responses] == [None, None, None]
    paths = [str(root / "images" / f"img0{i}.png") for i in range(3)]
    expected = [engine(engine.preprocess(paths[:2])), engine(x), engine(engine.preprocess(paths[2:]))]
    for response, want in zip(responses, expected, strict=True):
        np.testing.assert_array_equal(response.outputs["logits"], want)


def test_a_bad_request_fails_alone(served) -> None:  # type: ignore[no-untyped-def]
    model, engine, root = served
    good = {"IMAGE": images(root, ["img03.png"])}
    responses = model.execute([
        {"IMAGE": np.array([[b"not an image"]], dtype=object)},
        good,
        {"input": np.zeros((1, 3, 16, 16), np.float32)},  # wrong size: refused by the Engine, alone
        {},
        {"IMAGE": images(root, ["img03.png"]), "input": np.zeros((1, 3, 32, 32), np.float32)},
        {"IMAGE": np.array([["text"]], dtype=object)},
    ])  # fmt: skip
    errors = [r.error for r in responses]
    assert "Cannot read image" in errors[0]
    assert errors[1] is None
    expected = engine(engine.preprocess([root / "images" / "img03.png"]))
    np.testing.assert_array_equal(responses[1].outputs["logits"], expected)
    assert "shape" in errors[2]
    assert "sends no input" in errors[3]
    assert "not both" in errors[4]
    assert "arrived as text" in errors[5]
