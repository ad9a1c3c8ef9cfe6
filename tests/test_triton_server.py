"""A real Triton Inference Server serving what `trtopt export --triton` writes.

The server is the one PyPI's nvidia-pytriton ships (Triton 2.51.0; tools/triton_env.py installs it into its
own numpy<2 venv, tools/triton_server.py starts it on free localhost ports and stops it). It serves the demo
plan through the exported Python-backend model, two instances with dynamic batching; its stub runs the
trtopt under test. Real photos go in concurrently over HTTP and gRPC with `tritonclient`, and every answer
must equal `trtopt.Engine` in this process bit for bit. Readiness, metadata, configuration and the
Prometheus metrics endpoint are checked too.

Without the server venv or tritonclient the tests skip and say how to get them; TRTOPT_REQUIRE_TRITON=1
(.ci/run) makes that, or a server that does not start, a failure.
"""

from __future__ import annotations

import os
import re
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import trtopt
from trtopt.data.classes import top_k
from trtopt.plan import write_plan
from trtopt.serving.triton import TritonOptions, export_triton

pytestmark = pytest.mark.slow  # builds the demo plan and starts a server: about 20 s on an idle 2-core machine
ROOT = Path(__file__).resolve().parents[1]
PHOTOS = sorted((ROOT / "calib_data").glob("*.jpg"))[:12]
TIMEOUT = 60.0  # seconds per request


def _unavailable(reason: str) -> None:
    if os.environ.get("TRTOPT_REQUIRE_TRITON") == "1":
        pytest.fail(f"TRTOPT_REQUIRE_TRITON=1 but the Triton server test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def _tools() -> Any:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import triton_env
        import triton_server
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return triton_env, triton_server


def _dist() -> Any:
    triton_env, _ = _tools()
    try:
        return triton_env.find_server()
    except triton_env.Unavailable as exc:
        _unavailable(str(exc))


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("no_such_backend", "(?s)exited with code.*no_such_backend"),  # --exit-on-error ends the server
        ("python", "(?s)not ready within 4 s.*model file not found"),  # a stub that never starts: the timeout
    ],
)
def test_a_server_that_cannot_load_its_model_stops_with_its_log(tmp_path: Path, backend: str, message: str) -> None:
    """The launcher's failure paths: start() raises with the end of the server's log, and stops it."""
    _, triton_server = _tools()
    (tmp_path / "repo" / "broken" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "broken" / "config.pbtxt").write_text(
        f'backend: "{backend}"\nmax_batch_size: 0\ninput {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }}\n'
    )  # and no model file
    server = triton_server.TritonServer(_dist(), tmp_path / "repo", tmp_path, timeout=4)
    with pytest.raises(triton_server.ServerError, match=message):
        server.start()
    assert server.process is None  # stopped: its process group signalled and the server reaped


def _stand_in_plan(tmp_path: Path, backend: str) -> Path:
    """A TensorRT plan (tests/test_triton_export.py's stand-in) or a CPU plan around tiny_cnn's FP32 ONNX with a
    dynamic batch: enough for a configuration, which is all Triton reads before it looks for the backend."""
    from test_triton_export import trt_plan

    from trtopt.plan import Plan, TensorSpec
    from trtopt.zoo import build_model

    if backend == "tensorrt":
        return trt_plan(tmp_path / "m.engine")
    model = build_model("tiny_cnn", seed=1)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    io = (TensorSpec("input", (-1, 3, 32, 32), "float32"),), (TensorSpec("logits", (-1, 10), "float32"),)
    return write_plan(Plan("cpu", *io, {"onnx": model.SerializeToString()}), tmp_path / "m.engine")


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_tensorrt_and_onnxruntime_configs_pass_tritons_own_validation(tmp_path: Path, backend: str) -> None:
    """No TensorRT or ONNX Runtime backend installs from PyPI, but Triton parses and validates every
    configuration when it polls the repository, before it looks for the backend library: an exported model
    must fail only at that lookup. A configuration Triton refuses fails earlier, with Triton's reason."""
    _, triton_server = _tools()
    dist = _dist()
    options = TritonOptions(backend=backend, preferred_batch=(4,))
    export_triton(_stand_in_plan(tmp_path, backend), tmp_path / "repo", options)
    (tmp_path / "run").mkdir()
    server = triton_server.TritonServer(dist, tmp_path / "repo", tmp_path / "run", timeout=60)
    with pytest.raises(triton_server.ServerError) as failed:
        server.start()
    assert f"unable to find backend library for backend '{backend}'" in str(failed.value)
    assert "Poll failed for model directory 'm'" not in str(failed.value)
    config = tmp_path / "repo" / "m" / "config.pbtxt"
    config.write_text(config.read_text().replace("preferred_batch_size: [ 4 ]", "preferred_batch_size: [ 64 ]"))
    with pytest.raises(triton_server.ServerError, match="preferred size must be <= max batch size"):
        server.start()


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    triton_env, triton_server = _tools()
    try:
        import tritonclient.grpc  # noqa: F401
        import tritonclient.http  # noqa: F401
    except ImportError as exc:
        _unavailable(f"tritonclient is not installed ({exc}): pip install -e '.[serving]'")
    dist = _dist()
    stale = triton_env.version_mismatches(dist)
    if stale:
        _unavailable(f"the server venv's {', '.join(stale)}: run `python tools/triton_env.py` to align them")
    work = tmp_path_factory.mktemp("triton")
    plan = request.getfixturevalue("demo_plan")  # the demo model's INT8 plan on 16 photos (tests/conftest.py)
    env = triton_env.stub_env(work / "stub-env", dist)
    options = TritonOptions(name="demo", instances=2, threads=1, queue_delay_us=2000, python_env=str(env))
    export_triton(plan, work / "repo", options)
    server = triton_server.TritonServer(dist, work / "repo", work)
    try:
        server.start()
    except triton_server.ServerError as exc:
        _unavailable(f"the Triton server did not start: {exc}")
    engine = trtopt.Engine.load(plan, threads=1)
    try:
        yield SimpleNamespace(server=server, engine=engine)
    finally:
        engine.close()
        server.stop()


def _http(triton: Any) -> Any:
    import tritonclient.http as http

    return http.InferenceServerClient(triton.server.http_url, connection_timeout=TIMEOUT, network_timeout=TIMEOUT)


def _grpc(triton: Any) -> Any:
    import tritonclient.grpc as grpc

    return grpc.InferenceServerClient(triton.server.grpc_url)


def test_ready_metadata_and_config(triton: Any) -> None:
    http, grpc = _http(triton), _grpc(triton)
    try:
        assert http.is_server_live() and http.is_server_ready() and http.is_model_ready("demo")
        assert grpc.is_server_ready() and grpc.is_model_ready("demo")
        meta = http.get_model_metadata("demo")
        assert meta["platform"] == "python" and meta["versions"] == ["1"]
        assert meta["inputs"] == [
            {"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]},
            {"name": "IMAGE", "datatype": "BYTES", "shape": [-1, 1]},
        ]
        assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}]
        grpc_meta = grpc.get_model_metadata("demo", as_json=True)
        assert [i["name"] for i in grpc_meta["inputs"]] == ["input", "IMAGE"]
        config = http.get_model_config("demo")
        assert config["max_batch_size"] == 8 and config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
        assert config["instance_group"][0]["count"] == 2 and config["instance_group"][0]["kind"] == "KIND_CPU"
        assert config["output"][0]["label_filename"] == "labels.txt"
    finally:
        http.close()
        grpc.close()


def _infer(triton: Any, protocol: str, photos: list[Path], classes: int = 0) -> np.ndarray:
    """One request with these photos as encoded bytes; a fresh client per call (clients are per thread)."""
    module = __import__(f"tritonclient.{protocol}", fromlist=["InferInput"])
    client = _http(triton) if protocol == "http" else _grpc(triton)
    try:
        images = module.InferInput("IMAGE", [len(photos), 1], "BYTES")
        images.set_data_from_numpy(np.array([[p.read_bytes()] for p in photos], dtype=object))
        output = module.InferRequestedOutput("logits", class_count=classes)
        extra = {} if protocol == "http" else {"client_timeout": TIMEOUT}
        return client.infer("demo", [images], outputs=[output], **extra).as_numpy("logits")
    finally:
        client.close()


def _infer_tensor(triton: Any, protocol: str, x: np.ndarray) -> np.ndarray:
    module = __import__(f"tritonclient.{protocol}", fromlist=["InferInput"])
    client = _http(triton) if protocol == "http" else _grpc(triton)
    try:
        tensor = module.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("demo", [tensor]).as_numpy("logits")
    finally:
        client.close()


def test_concurrent_photos_over_http_and_grpc_equal_the_engine(triton: Any) -> None:
    """Images and tensors, one or several per request, at once (the batcher may group both in one execute())."""
    engine = triton.engine
    jobs: list[tuple[str, Any]] = [(protocol, [photo]) for photo in PHOTOS for protocol in ("http", "grpc")]
    jobs += [("grpc", PHOTOS[:3]), ("http", PHOTOS[3:5])]  # several images in one request
    tensors = engine.preprocess([str(p) for p in PHOTOS[5:8]])
    jobs += [("grpc", tensors[:2]), ("http", tensors[2:])]  # the plan's own input

    def send(job: tuple[str, Any]) -> np.ndarray:
        protocol, what = job
        return _infer_tensor(triton, protocol, what) if isinstance(what, np.ndarray) else _infer(triton, *job)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(send, jobs))
    for (protocol, what), answer in zip(jobs, answers, strict=True):
        inputs = what if isinstance(what, np.ndarray) else engine.preprocess([p.read_bytes() for p in what])
        expected = engine(inputs)
        assert answer.dtype == np.float32 and answer.shape == expected.shape, protocol
        assert np.array_equal(answer, expected), (protocol, what if isinstance(what, np.ndarray) else what[0].name)


def test_labels_through_the_classification_extension(triton: Any) -> None:
    engine = triton.engine
    for protocol in ("http", "grpc"):
        answer = _infer(triton, protocol, PHOTOS[:2], classes=5)
        expected = top_k(engine(engine.preprocess([str(p) for p in PHOTOS[:2]])), 5, engine.labels)
        for row, predictions in zip(answer, expected, strict=True):
            got = [entry.decode().split(":", 2) for entry in row]  # "value:index:label"
            assert [(int(i), label) for _, i, label in got] == [(p.index, p.label) for p in predictions]


def test_tensors_in_and_a_bad_image_fails_alone(triton: Any) -> None:
    import tritonclient.grpc as grpc
    from tritonclient.utils import InferenceServerException

    engine = triton.engine
    x = engine.preprocess([str(PHOTOS[0]), str(PHOTOS[1])])
    client = _grpc(triton)
    try:
        tensor = grpc.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        answer = client.infer("demo", [tensor], client_timeout=TIMEOUT).as_numpy("logits")
        assert np.array_equal(answer, engine(x))
        bad = grpc.InferInput("IMAGE", [1, 1], "BYTES")
        bad.set_data_from_numpy(np.array([[b"not an image"]], dtype=object))
        with pytest.raises(InferenceServerException, match="Cannot read image"):
            client.infer("demo", [bad], client_timeout=TIMEOUT)
        assert client.is_model_ready("demo")
    finally:
        client.close()
    assert np.array_equal(_infer(triton, "http", PHOTOS[:1]), engine(engine.preprocess([PHOTOS[0].read_bytes()])))


def _metric(triton: Any, name: str) -> float:
    with urllib.request.urlopen(triton.server.metrics_url, timeout=TIMEOUT) as response:
        text = response.read().decode()
    match = re.search(rf'^{name}\{{[^}}]*model="demo"[^}}]*\}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name} for model demo not in the metrics:\n{text[:2000]}"
    return float(match.group(1))


def test_metrics_count_the_requests(triton: Any) -> None:
    before = _metric(triton, "nv_inference_request_success"), _metric(triton, "nv_inference_count")
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda p: _infer(triton, "http", [p]), PHOTOS[:8]))
    deadline = time.monotonic() + 60  # how long to wait for the counters, not a verdict: the loop ends when they count
    while True:
        after = _metric(triton, "nv_inference_request_success"), _metric(triton, "nv_inference_count")
        if after[0] - before[0] >= 8 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert after[0] - before[0] == 8  # requests
    assert after[1] - before[1] == 8  # samples (one image each)
    assert _metric(triton, "nv_inference_exec_count") <= _metric(triton, "nv_inference_count")  # batches <= samples
