"""The whole pipeline (and each pass alone) on every zoo model and on the real light models, plus the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import numpy_helper
from pass_helpers import RTOL, assert_canonical, max_relative_error, random_feeds

from trtopt.cli.main import main
from trtopt.errors import UnknownNameError
from trtopt.execution.ort_session import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.passes import DEFAULT_ORDER, METADATA_KEY, PASSES, OptimizeResult, optimize, record_metadata
from trtopt.zoo import NAMES, build_model, light
from trtopt.zoo.light import LIGHT_NAMES, light_model, light_path

FAST_LIGHT = tuple(n for n in LIGHT_NAMES if n != "vgg19")  # VGG-19 (550 MB of weights) runs 1/8 as wide, below


def check(
    graph: gs.Graph, passes: tuple[str, ...] | None, reference: dict[str, np.ndarray],
    unchanged: onnx.ModelProto | None = None,
) -> OptimizeResult:
    """Optimise, check canonical form, idempotence and outputs; returns the result. `unchanged` is `graph`
    exported (`onnx_from_graph`), passed by a caller that checks one graph many times (exported here otherwise)."""
    result = optimize(graph, passes)
    exported = assert_canonical(result.graph)
    again = optimize(result.graph, passes)
    assert not again.changed, [r.summary() for r in again.reports if r.changed]
    if result.changed:
        feeds = random_feeds(graph)
        error = max_relative_error(reference, run_model(result.graph, feeds, opt_level="disable"))
        assert error <= RTOL, f"{passes}: {error:.2e}"
    else:  # nothing matched: the graph must come out as it went in
        assert exported.graph == (unchanged or onnx_from_graph(gs.Graph.copy(graph))).graph
    return result


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_pipeline_and_each_pass(name: str) -> None:
    graph = graph_from_onnx(build_model(name, batch=2, seed=3))
    reference = run_model(graph, random_feeds(graph), opt_level="disable")
    for passes in [None, *((p,) for p in DEFAULT_ORDER)]:
        check(graph, passes, reference)


@pytest.mark.parametrize("opset", [11, 12, 14, 21])
def test_tiny_cnn_across_opsets(opset: int) -> None:
    graph = graph_from_onnx(build_model("tiny_cnn", batch=1, opset=opset))
    check(graph, None, run_model(graph, random_feeds(graph), opt_level="disable"))




# What the default pipeline must find in each real topology (structure, not just numbers).
EXPECTED_LIGHT = {
    "resnet50": {"fold_batchnorm": {"fold_bn": 53}, "fuse_cbr": {"sum_to_add": 16}},
    "inception_v1": {"simplify": {"ort_basic": 1}, "fuse_parallel_convs": {"fuse_parallel": 9}},  # its Dropout
    "densenet121": {"fold_batchnorm": {"fold_bn": 59, "fold_mul": 59, "fold_add": 59}},
    "squeezenet": {"simplify": {"ort_basic": 1}},  # its Dropout
    "shufflenet": {"fold_batchnorm": {"fold_bn": 49}, "fuse_cbr": {"sum_to_add": 13}},
    "vgg19": {"simplify": {"ort_basic": 1}},  # its Dropouts
}


def _light_case(graph: gs.Graph, name: str) -> None:
    reference = run_model(graph, random_feeds(graph), opt_level="disable")
    result = check(graph, None, reference)
    optimised = result.graph
    reports = {r.name: r.counts() for r in result.reports if r.changed}
    assert reports == EXPECTED_LIGHT[name]
    assert "BatchNormalization" not in {n.op for n in optimised.nodes} or name == "densenet121"
    if not reports:  # the pipeline ran each pass on this graph and none changed it: each alone would see the
        return  # same graph and do the same (on VGG-19 the checks below took 50 of the test's 105 s)
    unchanged = onnx_from_graph(gs.Graph.copy(graph))  # optimize copies `graph`: one export serves every pass
    for name_ in DEFAULT_ORDER:
        check(graph, (name_,), reference, unchanged)


@pytest.mark.parametrize("name", FAST_LIGHT)
def test_light_model(name: str, light_graph: Callable[[str], gs.Graph]) -> None:
    _light_case(light_graph(name), name)


NARROWER = 8  # VGG-19's widths divided by this: its 550 MB of weights become about 9 MB


def narrow_light_file(name: str, folder: Path) -> Path:
    """onnx's light export of `name` with every width that is a multiple of NARROWER divided by it: the weights'
    fill shapes, the Reshape target (512 * 7 * 7 -> 64 * 7 * 7), the stored biases and the output. The nodes, the
    Dropouts and the spatial sizes stay as exported. Written to `folder` for `light_model` to read."""
    model = onnx.load(light_path(name))
    graph = model.graph
    for init in graph.initializer:
        value = numpy_helper.to_array(init)
        if value.dtype == np.int64:  # a ConstantOfShape fill's shape, or the Reshape target
            value = np.where(value % NARROWER == 0, value // NARROWER, value)
        else:  # a bias stored as numbers (conv1_1, conv1_2)
            value = value[: len(value) // NARROWER]
        init.CopyFrom(numpy_helper.from_array(value, init.name))
    inits = {i.name: i for i in graph.initializer}
    for value_info in [*graph.input, *graph.output]:
        dims = value_info.type.tensor_type.shape.dim
        if value_info.name in inits:  # IR 3 lists the initializers as inputs too
            for dim, size in zip(dims, inits[value_info.name].dims, strict=True):
                dim.dim_value = size
        elif value_info in graph.output:
            dims[-1].dim_value //= NARROWER  # the classes
    path = folder / light_path(name).name
    onnx.save(model, path)
    return path


def test_light_vgg19_at_an_eighth_of_its_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """VGG-19's topology as exported, 1/8 as wide: what the pipeline finds depends on the nodes, and the full
    widths (550 MB of weights, 20 GFLOPs a run) cost minutes of the suite for the same checks."""
    narrow = narrow_light_file("vgg19", tmp_path)
    exported = onnx.load(light_path("vgg19"))
    monkeypatch.setattr(light, "light_path", lambda name: narrow)
    model = light_model("vgg19")
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    assert weights["conv1_1_w_0"] == (8, 3, 3, 3) and weights["fc6_w_0"] == (512, 64 * 7 * 7)
    assert [n.op_type for n in onnx.load(narrow).graph.node] == [n.op_type for n in exported.graph.node]
    _light_case(graph_from_onnx(model), "vgg19")


def test_resnet50_groups(light_graph: Callable[[str], gs.Graph]) -> None:
    result = optimize(light_graph("resnet50"))
    kinds = [g.kind for g in result.fusion_groups]
    assert kinds.count("conv+add+relu") == 16 and kinds.count("conv+relu") == 33
    assert result.launches_saved > 100 and result.bytes_saved > 0


def recorded_metadata(model: onnx.ModelProto) -> dict[str, object] | None:
    raw = [p.value for p in model.metadata_props if p.key == METADATA_KEY]
    assert len(raw) <= 1, "record_metadata replaces, never duplicates"
    return json.loads(raw[0]) if raw else None


def test_metadata_is_the_report_summary_and_groups() -> None:
    result = optimize(graph_from_onnx(build_model("tiny_cnn")))
    model = onnx_from_graph(result.graph)
    record_metadata(model, result)
    record_metadata(model, result)
    meta = recorded_metadata(onnx.load_from_string(model.SerializeToString()))
    assert meta is not None and meta["version"] == 2 and meta["passes"] == list(DEFAULT_ORDER)
    assert {k: meta[k] for k in result.to_dict(details=False)} == result.to_dict(details=False)
    groups = meta["groups"]
    assert isinstance(groups, dict) and len(groups["fusion"]) == len(result.fusion_groups) > 0
    assert [g["output"] for g in groups["concat"]] == [g.output for g in result.concat_groups]
    assert recorded_metadata(build_model("tiny_cnn")) is None


def test_unknown_pass_lists_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        optimize(graph_from_onnx(build_model("tiny_cnn")), ["fold_batchnorm", "fold_bn"])
    assert set(info.value.valid) == set(PASSES.names())


def test_cli_optimize(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    source, target = tmp_path / "m.onnx", tmp_path / "out" / "m.opt.onnx"
    onnx.save(build_model("tiny_cnn"), source)
    assert main(["optimize", str(source), "-o", str(target), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passes"] == [p["name"] for p in report["reports"]] == list(DEFAULT_ORDER)
    assert report["after"]["kernel_launches"] < report["before"]["kernel_launches"]
    meta = recorded_metadata(onnx.load(target))
    assert meta is not None and meta["groups"] == report["groups"] and meta["changes"] == report["changes"]
    assert main(["optimize", str(source), "-o", str(target), "--passes", "fuse_cbr"]) == 0
    assert "fuse_cbr" in capsys.readouterr().out
    assert main(["optimize", str(source), "-o", str(target), "--passes", "fold,fuse_cbr"]) == 2
    assert "fold_batchnorm" in capsys.readouterr().err


EFFNET = Path(__file__).resolve().parents[1] / "models" / "efficientnet_lite0.onnx"


@pytest.mark.skipif(not EFFNET.exists(), reason="models/efficientnet_lite0.onnx is not in this checkout")
def test_efficientnet_lite0_real_weights() -> None:
    """The pretrained model (BN already folded by the exporter): ReLU6 groups, residual Adds."""
    graph = graph_from_onnx(EFFNET, shapes={"input": (1, 3, 224, 224)})
    result = check(graph, None, run_model(graph, random_feeds(graph), opt_level="disable"))
    kinds = {g.kind for g in result.fusion_groups}
    assert {"conv+relu6", "conv+add"} <= kinds


def test_light_model_dynamic_batch_runs_any_batch_like_batch_one() -> None:
    """`dynamic_batch=True` (the benchmarks' light:NAME models): batch 2 gives what two batch-1 runs give."""
    model = light_model("resnet50", dynamic_batch=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    name = model.graph.input[0].name
    both = next(iter(run_model(model, {name: x}).values()))
    one = [next(iter(run_model(model, {name: x[i : i + 1]}).values())) for i in range(2)]
    assert both.shape[0] == 2
    np.testing.assert_allclose(both, np.concatenate(one), rtol=1e-4, atol=1e-4)
