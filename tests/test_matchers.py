"""One matcher per pass (issue #17): `trtopt inspect` reports what `trtopt optimize` does, pass by pass;
each pass rewrites exactly what its matcher finds; and the fusion groups fuse_cbr records are real
fusions, checked by running each one as ONNX Runtime's own fused kernel (tests/fused_kernels.py).

Models: the synthetic zoo, the light models from the onnx package but VGG-19 (session fixture
`light_graph`), the demo model, and for inspect vs optimize the real-model zoo where it is cached. On the
demo model, `inspect` used to list 33 Conv+ReLU6 "opportunities" while `optimize` said "fuse_cbr: no
match": both were right about different things.
The groups exist (run fused they give the same outputs, below) and need no rewrite, which fuse_cbr now
reports as records next to its rewrites, and `inspect` shows the same report.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from fused_kernels import with_fused_kernels
from pass_helpers import RTOL, max_relative_error, random_feeds
from test_zoo_models import shapes_flag
from zoo_fixtures import ZOO_NAMES, zoo_case

from trtopt.cli.main import main
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx
from trtopt.frontend.edit import canonicalize
from trtopt.passes import DEFAULT_ORDER, PASSES, FusionGroup, find_fusion_groups, optimize
from trtopt.zoo import NAMES, GraphBuilder, build_model
from trtopt.zoo.light import LIGHT_NAMES, light_model

DEMO = Path(__file__).resolve().parents[1] / "models" / "efficientnet_lite0.onnx"
DEMO_SHAPES = {"input": (1, 3, 224, 224)}
LIGHT = tuple(f"light:{n}" for n in LIGHT_NAMES if n != "vgg19")  # VGG-19: 550 MB, slow-marked elsewhere
needs_demo = pytest.mark.skipif(not DEMO.exists(), reason="models/efficientnet_lite0.onnx is not in this checkout")
ALL_MODELS = [*NAMES, *LIGHT, pytest.param("demo", marks=needs_demo)]


@cache
def _demo_graph() -> gs.Graph:
    return graph_from_onnx(DEMO, shapes=DEMO_SHAPES)


@pytest.fixture()
def model_graph(light_graph: Callable[[str], gs.Graph]) -> Callable[[str], gs.Graph]:
    """A model by name: a zoo model, light:NAME, or "demo". Shared: copy before changing it."""

    def load(name: str) -> gs.Graph:
        if name.startswith("light:"):
            return light_graph(name.removeprefix("light:"))
        return _demo_graph() if name == "demo" else graph_from_onnx(build_model(name))

    return load


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


# Light models whose CLI round trip is cheap: ResNet-50 and DenseNet-121 cost 14 s and 5 s here (writing and reading
# 100 MB), and their patterns (bottleneck residuals, dense concats) are covered at the matcher level below.
LIGHT_CLI = tuple(m for m in LIGHT if m not in ("light:resnet50", "light:densenet121"))


@pytest.mark.parametrize("name", [*NAMES, *LIGHT_CLI, pytest.param("demo", marks=needs_demo)])
def test_inspect_reports_what_optimize_does(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both commands on the same file: the same rewrites and records per pass, the same groups."""
    path = DEMO if name == "demo" else tmp_path / f"{name}.onnx"
    if name.startswith("light:"):
        onnx.save(light_model(name.removeprefix("light:")), path)
    elif name != "demo":
        onnx.save(build_model(name), path)
    shapes = ["--shapes", "input:1x3x224x224"] if name == "demo" else []
    assert_inspect_equals_optimize(capsys, path, shapes, tmp_path)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_inspect_reports_what_optimize_does_on_the_real_zoo(name: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The same on every cached real model (tools/zoo.py; skipped with the reason where the cache is empty)."""
    case = zoo_case(name)
    assert_inspect_equals_optimize(capsys, case.path, shapes_flag(case), tmp_path)


def assert_inspect_equals_optimize(capsys: pytest.CaptureFixture[str], path: Path, shapes: list[str],
                                   tmp_path: Path) -> None:  # fmt: skip
    inspected = cli_json(capsys, "inspect", str(path), "--json", *shapes)["fusions"]
    optimized = cli_json(capsys, "optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--json", *shapes)
    assert isinstance(inspected, dict)
    for key in ("passes", "changes", "recorded", "nodes", "groups"):
        assert inspected[key] == optimized[key], key
    groups = optimized["groups"]["fusion"]  # type: ignore[index]
    assert optimized["recorded"]["fuse_cbr"] == dict(Counter(g["kind"] for g in groups))  # type: ignore[index]


@pytest.mark.parametrize("name", ALL_MODELS)
def test_each_pass_rewrites_exactly_what_its_matcher_finds(
    name: str, model_graph: Callable[[str], gs.Graph]
) -> None:
    """In pipeline order: a pass's rewrites are its matcher's matches, and afterwards it finds nothing.
    eliminate_concat looks again after each round of rewrites, so its first round is a lower bound."""
    work = canonicalize(model_graph(name).copy())
    for pass_name in DEFAULT_ORDER:
        graph_pass = PASSES.get(pass_name)
        found = Counter(match.kind for match in graph_pass.find(work))
        report = graph_pass(work)
        if pass_name == "eliminate_concat":
            assert set(found) <= set(report.counts()) and bool(found) == report.changed
        else:
            assert report.counts() == dict(found), pass_name
        assert not graph_pass.find(work), f"{pass_name} left matches behind"
    assert [r.nodes for r in report.recorded] == [g.nodes for g in find_fusion_groups(work)]


@pytest.mark.parametrize("name", ALL_MODELS)
def test_recorded_groups_run_as_fused_kernels(name: str, model_graph: Callable[[str], gs.Graph]) -> None:
    """Every group ONNX Runtime has a fused kernel for is replaced by it; the outputs stay the same."""
    result = optimize(model_graph(name))
    fused, replaced = with_fused_kernels(result.graph)
    skipped = [g for g in result.fusion_groups if replaced[g.kind] == 0]
    assert all(g.kind.split("+")[-1] in ("silu", "hard_swish") for g in skipped), skipped
    if result.fusion_groups:
        assert sum(replaced.values()) > 0
    feeds = random_feeds(result.graph)
    reference = run_model(result.graph, feeds, opt_level="disable")
    assert max_relative_error(reference, run_model(fused, feeds, opt_level="disable")) <= RTOL
    if name == "demo":  # the 33 Conv+ReLU6, all real, and the 9 residual Adds
        assert replaced == {"conv+relu6": 33, "conv+add": 9}


def test_a_wrong_group_fails_the_fused_kernel_check() -> None:
    """The check can fail: a group that claims ReLU where the graph has Sigmoid changes the outputs.

    input ─ Conv ─ Sigmoid ─ output
    """
    b = GraphBuilder("wrong", seed=0, opset=17)
    b.input("input", [1, 4, 8, 8])
    model = b.build([b.node("Sigmoid", [b.conv("input", 4, 4, 3)], out="output")])
    graph = graph_from_onnx(model)
    (group,) = find_fusion_groups(graph)
    assert group.kind == "conv+sigmoid"
    wrong = FusionGroup("conv+relu", group.nodes, group.input, None, group.output)
    fused, replaced = with_fused_kernels(graph, [wrong])
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)}
    before, after = (run_model(g, feeds, opt_level="disable") for g in (graph, fused))
    error = max_relative_error(before, after)
    assert replaced == {"conv+relu": 1} and error > 0.1
