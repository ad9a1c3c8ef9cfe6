"""`trtopt export --triton`: config.pbtxt for TensorRT plans (stand-in plans: the header of a real one, an
engine section of placeholder bytes) and CPU plans (real builds of a tiny model), the files beside it, the
exporter's own checks, and the protobuf text format they are written in. tests/test_triton_server.py
serves what this writes on a real Triton server."""

from __future__ import annotations

import pytest
from model_files import dynamic_batch_tiny_plan

from trtopt.errors import TrtoptError
from trtopt.plan import Plan, TensorSpec, write_plan
from trtopt.serving.triton import TritonOptions, export_triton
from trtopt.serving.triton.check import ExportCheckError, check_config, check_with_triton_schema
from trtopt.serving.triton.config import REPEATED
from trtopt.serving.triton.pbtxt import Enum, PbtxtError, dict_from_pbtxt

LABELS = [f"class {i}" for i in range(10)]


def trt_plan(path, *, shape=(-1, 3, 8, 8), profile_max=16, dtype="float32", labels=LABELS, out=(-1, 10)):  # type: ignore[no-untyped-def]
    """A TensorRT plan as `trtopt build --backend tensorrt --batch 16` would describe it, engine bytes aside."""
    metadata = {"labels": labels}
    if profile_max is not None:
        lo = [1, *shape[1:]]
        metadata["profiles"] = {"x": {"min": lo, "opt": [profile_max, *shape[1:]], "max": [profile_max, *shape[1:]]}}
    plan = Plan(
        backend="tensorrt",
        inputs=(TensorSpec("x", shape, dtype),),
        outputs=(TensorSpec("y", out, "float32"),),
        sections={"engine": b"stand-in serialized engine"},
        metadata=metadata,
        versions={"tensorrt": "11.0.0.1", "trtopt": "0.1.0"},
    )
    write_plan(plan, path)
    return path


def config_of(folder):  # type: ignore[no-untyped-def]
    return dict_from_pbtxt((folder / "config.pbtxt").read_text(), REPEATED)


def test_tensorrt_plan_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = trt_plan(tmp_path / "resnet.engine")
    report = export_triton(plan, tmp_path / "repo", TritonOptions(instances=2, preferred_batch=(8, 16)))
    folder = tmp_path / "repo" / "resnet"
    assert report.path == folder and report.backend == "tensorrt" and report.max_batch_size == 16
    config = config_of(folder)
    assert config["platform"] == "tensorrt_plan" and "backend" not in config
    assert config["max_batch_size"] == 16  # the profile's max batch
    assert config["input"] == [{"name": "x", "data_type": Enum("TYPE_FP32"), "dims": [3, 8, 8]}]
    assert config["output"] == [
        {"name": "y", "data_type": Enum("TYPE_FP32"), "dims": [10], "label_filename": "labels.txt"}
    ]
    assert config["dynamic_batching"] == {"preferred_batch_size": [8, 16]}
    assert config["instance_group"] == [{"count": 2, "kind": Enum("KIND_GPU")}]
    assert (folder / "1" / "model.plan").read_bytes() == b"stand-in serialized engine"
    assert (folder / "labels.txt").read_text().splitlines() == LABELS
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["resnet"]  # no staging folder left
    assert any("TensorRT 11.0.0.1" in n for n in report.notes)


def test_tensorrt_config_parses_with_tritons_schema(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("tritonclient.grpc", reason="needs tritonclient: pip install 'trtopt[serving]'")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    export_triton(trt_plan(tmp_path / "m.engine"), tmp_path / "repo", TritonOptions(queue_delay_us=100))
    parsed = text_format.Parse((tmp_path / "repo/m/config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert parsed.platform == "tensorrt_plan" and parsed.max_batch_size == 16
    assert list(parsed.input[0].dims) == [3, 8, 8] and parsed.input[0].data_type == model_config_pb2.TYPE_FP32
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 100
    assert parsed.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert check_with_triton_schema("platform: \"x\"\nmax_batch_size: 1\n")
    with pytest.raises(ExportCheckError, match="schema refuses"):
        check_with_triton_schema("max_batch_sise: 1\n")  # a misspelt field
    with pytest.raises(ExportCheckError, match="schema refuses"):
        check_with_triton_schema("instance_group { kind: KIND_TPU }\n")


def test_tensorrt_non_batch_dynamic_dims_take_the_profile_sizes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "seg.engine"
    plan = Plan(
        backend="tensorrt",
        inputs=(TensorSpec("x", (-1, 3, -1, -1), "float16"),),
        outputs=(TensorSpec("y", (-1, 2, -1, -1), "float16"),),
        sections={"engine": b"e"},
        metadata={"profiles": {"x": {"min": [1, 3, 64, 96], "opt": [4, 3, 64, 96], "max": [4, 3, 64, 96]}}},
    )
    write_plan(plan, path)
    export_triton(path, tmp_path / "repo", TritonOptions(max_batch=2, dynamic_batching=False))
    config = config_of(tmp_path / "repo" / "seg")
    assert config["max_batch_size"] == 2 and "dynamic_batching" not in config
    assert config["input"][0] == {"name": "x", "data_type": Enum("TYPE_FP16"), "dims": [3, 64, 96]}
    assert config["output"][0]["dims"] == [2, -1, -1]  # outputs keep what the plan says


def test_tensorrt_static_batch_is_served_with_max_batch_size_0(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = trt_plan(tmp_path / "one.engine", shape=(1, 3, 8, 8), profile_max=None, out=(1, 10))
    export_triton(plan, tmp_path / "repo")
    config = config_of(tmp_path / "repo" / "one")
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert config["input"][0]["dims"] == [1, 3, 8, 8] and config["output"][0]["dims"] == [1, 10]
    with pytest.raises(TrtoptError, match="cannot batch it"):
        export_triton(plan, tmp_path / "repo2", TritonOptions(max_batch=4))
    with pytest.raises(TrtoptError, match="needs a model that batches"):
        export_triton(plan, tmp_path / "repo3", TritonOptions(dynamic_batching=True))


@pytest.mark.parametrize(
    ("kwargs", "options", "message"),
    [
        ({"profile_max": None}, TritonOptions(), "does not record the largest batch.*--max-batch"),
        ({}, TritonOptions(max_batch=32), "larger than the batch this TensorRT engine was built for \\(16\\)"),
        ({}, TritonOptions(preferred_batch=(4, 32)), "--preferred-batch 32 is outside 1..16"),
        ({"dtype": "float64"}, TritonOptions(), "float64, which Triton's tensorrt backend does not take"),
        ({}, TritonOptions(backend="onnxruntime"), "serves only cpu plans.*this is a tensorrt plan"),
        ({}, TritonOptions(backend="nope"), "Unknown Triton backend 'nope'"),
        ({}, TritonOptions(threads=2), "tensorrt backend runs the model on the GPU"),
        ({}, TritonOptions(name="../escape"), "cannot be a model name"),
        ({}, TritonOptions(dynamic_batching=False, queue_delay_us=5), "switched off"),
        ({"labels": ["a\nb", *LABELS[1:]]}, TritonOptions(), "holds a line break"),
        ({}, TritonOptions(backend="python", python_env="envs/trtopt"), "must be an absolute path"),
        ({}, TritonOptions(python_env="/opt/env"), "--python-env is for the Python backend"),
    ],
)
def test_tensorrt_export_errors(tmp_path, kwargs, options, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TrtoptError, match=message):
        export_triton(trt_plan(tmp_path / "m.engine", **kwargs), tmp_path / "repo", options)
    assert not (tmp_path / "repo").exists() or list((tmp_path / "repo").iterdir()) == []


def test_existing_model_is_never_replaced_and_failures_leave_nothing(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    plan = trt_plan(tmp_path / "m.engine")
    export_triton(plan, tmp_path / "repo")
    before = (tmp_path / "repo/m/config.pbtxt").read_bytes()
    with pytest.raises(TrtoptError, match="already exists"):
        export_triton(plan, tmp_path / "repo", TritonOptions(instances=3))
    assert (tmp_path / "repo/m/config.pbtxt").read_bytes() == before

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ExportCheckError("planted")

    monkeypatch.setattr("trtopt.serving.triton.export.check_repository_model", broken)
    with pytest.raises(ExportCheckError, match="planted"):
        export_triton(plan, tmp_path / "repo", TritonOptions(name="other"))
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["m"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrtoptError, match="is a file"):
        export_triton(plan, tmp_path / "file")


def test_the_check_catches_a_config_that_contradicts_the_plan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trtopt.plan import read_plan

    plan = read_plan(trt_plan(tmp_path / "m.engine"))
    export_triton(tmp_path / "m.engine", tmp_path / "repo")
    good = config_of(tmp_path / "repo" / "m")
    check_config(good, plan, "tensorrt")
    tampered = [
        {**good, "input": [{**good["input"][0], "dims": [3, 8, 9]}]},
        {**good, "input": [{**good["input"][0], "data_type": Enum("TYPE_FP16")}]},
        {**good, "output": []},
        {**good, "max_batch_size": 0},
        {**good, "dynamic_batching": {"preferred_batch_size": [64]}},
        {**good, "instance_group": [{"count": 1, "kind": Enum("KIND_CPU")}]},
        {**good, "platform": "onnxruntime_onnx"},
    ]
    for config in tampered:
        with pytest.raises(ExportCheckError):
            check_config(config, plan, "tensorrt")


@pytest.fixture(scope="module")
def cpu_plan(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("cpu")
    dynamic_batch_tiny_plan(root, LABELS)
    return root


def test_cpu_plan_python_backend_by_default(cpu_plan, tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = export_triton(cpu_plan / "tiny.engine", tmp_path / "repo", TritonOptions(threads=1, python_env="/opt/env"))
    folder = tmp_path / "repo" / "tiny"
    assert report.backend == "python" and report.files == ("1/model.py", "1/plan.engine", "config.pbtxt", "labels.txt")
    config = config_of(folder)
    assert config["backend"] == "python" and config["max_batch_size"] == 8
    assert config["input"] == [
        {"name": "input", "data_type": Enum("TYPE_FP32"), "dims": [3, 32, 32], "optional": True},
        {"name": "IMAGE", "data_type": Enum("TYPE_STRING"), "dims": [1], "optional": True},
    ]
    assert config["dynamic_batching"] == {} and config["instance_group"] == [{"count": 1, "kind": Enum("KIND_CPU")}]
    params = {p["key"]: p["value"]["string_value"] for p in config["parameters"]}
    assert params == {"threads": "1", "EXECUTION_ENV_PATH": "/opt/env"}
    assert (folder / "1" / "plan.engine").read_bytes() == (cpu_plan / "tiny.engine").read_bytes()
    assert "TritonPythonModel" in (folder / "1" / "model.py").read_text()


def test_cpu_plan_onnxruntime_model_computes_what_the_engine_does(cpu_plan, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """model.onnx as Triton's ONNX Runtime backend would run it (default session options, one thread)."""
    import numpy as np
    import onnxruntime as ort

    import trtopt

    export_triton(cpu_plan / "tiny.engine", tmp_path / "repo",
                  TritonOptions(backend="onnxruntime", max_batch=4, instances=2, threads=1))  # fmt: skip
    config = config_of(tmp_path / "repo" / "tiny")
    assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 4
    assert config["instance_group"] == [{"count": 2, "kind": Enum("KIND_CPU")}]
    assert config["parameters"] == [{"key": "intra_op_thread_count", "value": {"string_value": "1"}}]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = str(tmp_path / "repo/tiny/1/model.onnx")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    with trtopt.Engine.load(cpu_plan / "tiny.engine", threads=1) as engine:
        np.testing.assert_array_equal(session.run(None, {"input": x})[0], engine(x))


def test_a_cpu_plan_has_no_engine_for_tritons_tensorrt_backend(cpu_plan, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TrtoptError, match="serves only tensorrt plans.*this is a cpu plan") as caught:
        export_triton(cpu_plan / "tiny.engine", tmp_path / "repo", TritonOptions(backend="tensorrt"))
    assert "--triton-backend onnxruntime or python" in str(caught.value)
    assert not (tmp_path / "repo").exists() or list((tmp_path / "repo").iterdir()) == []


def test_cli_export_triton(cpu_plan, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from trtopt.cli.main import main

    repo = str(tmp_path / "repo")
    assert main(["export", str(cpu_plan / "tiny.engine"), "--triton", repo, "--name", "t", "--instances", "2",
                 "--preferred-batch", "2,4", "--queue-delay-us", "200"]) == 0  # fmt: skip
    assert "wrote Triton model 't' (python backend" in capsys.readouterr().out
    config = config_of(tmp_path / "repo" / "t")
    assert config["dynamic_batching"] == {"preferred_batch_size": [2, 4], "max_queue_delay_microseconds": 200}
    assert main(["export", str(cpu_plan / "tiny.engine"), "--instances", "2", "-o", str(tmp_path / "x")]) == 2
    assert "configure a Triton export" in capsys.readouterr().err
    assert main(["export", str(cpu_plan / "tiny.engine"), "--triton", repo, "--name", "u", "--info"]) == 2
    assert main(["export", str(cpu_plan / "tiny.engine"), "--triton", repo, "--preferred-batch", "x"]) == 2
    assert "--preferred-batch takes batch sizes" in capsys.readouterr().err


def test_pbtxt_reads_comments_lists_and_reports_lines() -> None:
    text = '# header\nname: "a\\"b\\n\\101"\ninput [ { name: "x" dims: [ 1, -1 ] }, { name: "y" } ]\nf < k: V >\n'
    parsed = dict_from_pbtxt(text, frozenset({"dims"}))
    assert parsed == {"name": 'a"b\nA', "input": [{"name": "x", "dims": [1, -1]}, {"name": "y"}], "f": {"k": Enum("V")}}
    with pytest.raises(PbtxtError, match="line 3"):
        dict_from_pbtxt('a: 1\nb {\n c: "unterminated\n}\n')
    with pytest.raises(PbtxtError, match="line 2: expected ':' or '\\{' after b"):
        dict_from_pbtxt("a: 1\nb 2\n")


def test_a_tensorrt_build_records_the_batch_limit_export_serves(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """build_plan with --batch 16 on the TensorRT backend (TensorRT itself stood in for: the backend is
    selected and the sections built by stand-ins) records its optimisation profile; the export reads it."""
    import trtopt.build as build_module
    from trtopt.build import BuildConfig, build_plan
    from trtopt.zoo import build_model

    model = build_model("tiny_cnn", seed=1)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())

    def stand_in_build(backend, model, io, options, fp32, checks, config=None):  # type: ignore[no-untyped-def]
        return Plan(backend.name, io[0], io[1], {"engine": b"stand-in"}, versions={"tensorrt": "11.0.0.1"}), None

    from trtopt.backend import get_backend
    from trtopt.backend.tensorrt.options import TensorRTOptions

    monkeypatch.setattr(build_module, "select_backend", lambda name: (get_backend("tensorrt"), "stand-in"))
    monkeypatch.setattr(build_module, "build_verified", stand_in_build)
    config = BuildConfig(backend="tensorrt", int8=False, backend_options=(TensorRTOptions(batch=16),))
    plan = build_plan(tmp_path / "m.onnx", config).plan
    assert plan.metadata["profiles"] == {"input": {"min": [1, 3, 32, 32], "opt": [16, 3, 32, 32],
                                                   "max": [16, 3, 32, 32]}}  # fmt: skip
    write_plan(plan, tmp_path / "m.engine")
    report = export_triton(tmp_path / "m.engine", tmp_path / "repo")
    assert report.max_batch_size == 16 and config_of(tmp_path / "repo" / "m")["input"][0]["dims"] == [3, 32, 32]
