"""2:4 sparsity analysis: the pattern math, which layers are eligible along which axis, and `trtopt inspect`."""

from __future__ import annotations

import json

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sparsity_helpers import ELIGIBLE, NOT_ELIGIBLE, mask_by_hand, mixed_model, weights_of

from trtopt.analysis import summarize
from trtopt.analysis.sparsity import (
    analyze_sparsity,
    mask_24,
    prune_24,
    satisfies_24,
    weight_site,
    zero_group_share,
)
from trtopt.cli.main import main
from trtopt.frontend import graph_from_onnx
from trtopt.sparsify import with_weights

# --- the math ---------------------------------------------------------------------------------------


@st.composite
def weights_and_axis(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """A 3-D weight whose `axis` has a multiple of four entries; small integers make ties common."""
    axis = draw(st.integers(0, 2))
    shape = [draw(st.integers(1, 3)) for _ in range(3)]
    shape[axis] = 4 * draw(st.integers(1, 3))
    values = st.integers(-3, 3).map(float) | st.floats(-2, 2, width=32)
    return draw(arrays(np.float32, tuple(shape), elements=values)), axis


@settings(max_examples=150, deadline=None)
@given(weights_and_axis())
def test_pruning_keeps_the_two_largest_magnitudes_of_every_group(case: tuple[np.ndarray, int]) -> None:
    weight, axis = case
    keep = mask_24(weight, axis)
    pruned = prune_24(weight, axis)
    groups = np.moveaxis(np.abs(weight), axis, -1).reshape(-1, 4)
    kept = np.moveaxis(keep, axis, -1).reshape(-1, 4)
    assert (kept.sum(axis=1) == 2).all()
    assert (np.where(kept, groups, np.inf).min(axis=1) >= np.where(kept, -np.inf, groups).max(axis=1)).all()
    assert np.array_equal(pruned[keep], weight[keep]) and not pruned[~keep].any()
    assert satisfies_24(pruned, axis) and np.array_equal(keep, mask_by_hand(weight, axis))


def test_the_pattern_check_counts_groups_along_the_axis_only() -> None:
    weight = np.ones((4, 8), np.float32)
    weight[:, [0, 1, 4, 6]] = 0  # two zeros in each group of four along axis 1
    assert satisfies_24(weight, 1) and zero_group_share(weight, 1) == 1.0
    assert zero_group_share(weight, 0) == 0.5  # along axis 0 columns 2, 3, 5, 7 have no zero at all
    weight[1, 0] = 5.0
    assert zero_group_share(weight, 1) == 7 / 8
    with pytest.raises(ValueError, match="not a multiple of 4"):
        zero_group_share(np.zeros((2, 6)), 1)


# --- which layers, along which axis -----------------------------------------------------------------


def test_eligible_layers_and_their_axes_follow_nvidias_rule() -> None:
    graph = graph_from_onnx(mixed_model(), fold_constants=False)
    sites = {n.name: weight_site(n) for n in graph.nodes if n.op in ("Conv", "Gemm", "MatMul")}
    assert {name: s.axis for name, s in sites.items() if not isinstance(s, str)} == ELIGIBLE
    assert sites["conv_2"] == "1 input channels (per group) (depthwise), not a multiple of 4"
    assert sites["conv_5"] == "6 input channels (per group), not a multiple of 4"


def test_gemm_without_transb_groups_along_axis_0_and_other_layers_are_refused() -> None:
    x = gs.Variable("x", np.float32, (1, 8))
    weight = gs.Constant("w", np.ones((8, 4), np.float32))
    gemm = gs.Node("Gemm", "g", inputs=[x, weight], outputs=[gs.Variable("y")])
    site = weight_site(gemm)
    assert not isinstance(site, str) and site.axis == 0 and site.constant is weight
    gemm.attrs["transB"] = 1  # B is [N, K] = [8, 4]: K = 4 on axis 1
    transposed_b = weight_site(gemm)
    assert not isinstance(transposed_b, str) and transposed_b.axis == 1
    gemm.inputs[1] = gs.Constant("w6", np.ones((8, 6), np.float32))
    assert weight_site(gemm) == "6 reduction (K) entries, not a multiple of 4"
    computed = gs.Node("MatMul", "m", inputs=[x, gs.Variable("w_at_run_time", np.float32, (8, 4))])
    assert weight_site(computed) == "weights are computed at run time (not a constant)"
    batched = gs.Node("MatMul", "b", inputs=[x, gs.Constant("w3", np.ones((2, 8, 4), np.float32))])
    assert "rank 3" in weight_site(batched)  # type: ignore[operator]
    transposed = gs.Node("ConvTranspose", "t", inputs=[x, gs.Constant("wt", np.ones((8, 4, 1, 1), np.float32))])
    assert "convolution and fully connected" in weight_site(transposed)  # type: ignore[operator]


def test_quantised_weights_are_read_as_stored_integers_minus_zero_point() -> None:
    """Behind a DequantizeLinear a weight is zero exactly where the stored value equals its zero point."""
    stored = np.full((4, 8, 1, 1), 3, np.uint8)
    stored[:, [0, 1, 4, 5]] = 128  # the zero point: these are zeros
    zero = gs.Constant("zp", np.full(4, 128, np.uint8))
    restored = gs.Variable("w_dq", np.float32, (4, 8, 1, 1))
    gs.Node("DequantizeLinear", "dq", attrs={"axis": 0}, inputs=[gs.Constant("wq", stored),
            gs.Constant("s", np.ones(4, np.float32)), zero], outputs=[restored])  # fmt: skip
    conv = gs.Node("Conv", "c", inputs=[gs.Variable("x", np.float32, (1, 8, 2, 2)), restored])
    site = weight_site(conv)
    assert not isinstance(site, str) and site.constant is None and satisfies_24(site.values, 1)
    stored[0, 0, 0, 0] = 127
    assert not satisfies_24(weight_site(conv).values, 1)  # type: ignore[union-attr]


def test_report_counts_the_mac_shares_of_eligible_and_already_sparse_layers() -> None:
    model = mixed_model()
    pruned = with_weights(model, {"conv_w_3": prune_24(weights_of(model)["conv_3"], 1)})
    graph = graph_from_onnx(pruned, fold_constants=False)
    summary = summarize(graph)
    macs = {n.name: c.macs for n, c in zip(graph.nodes, summary.layers, strict=True)}
    report = analyze_sparsity(graph, macs)
    by_name = {layer.name: layer for layer in report.layers}
    assert {n for n, layer in by_name.items() if layer.eligible} == set(ELIGIBLE)
    assert [n for n, layer in by_name.items() if layer.is_24] == ["conv_3"]
    assert report.eligible_macs == sum(macs[n] or 0 for n in ELIGIBLE)
    assert report.share(report.sparse_macs) == pytest.approx(macs["conv_3"] / summary.macs)  # type: ignore[operator]
    assert all(by_name[n].reason for n in NOT_ELIGIBLE)


def test_inspect_reports_sparsity_in_json_and_text(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import onnx

    path = tmp_path / "mixed.onnx"
    model = mixed_model()
    onnx.save_model(with_weights(model, {"fc_w_1": prune_24(weights_of(model)["gemm_1"], 1)}), path)
    assert main(["inspect", str(path), "--json"]) == 0
    sparsity = json.loads(capsys.readouterr().out)["sparsity"]
    assert sparsity["eligible_layers"] == len(ELIGIBLE) and sparsity["sparse_layers"] == 1
    assert {x["name"]: x["axis"] for x in sparsity["layers"] if x["eligible"]} == ELIGIBLE
    assert 0 < sparsity["sparse_mac_share"] < sparsity["eligible_mac_share"] < 1
    assert main(["inspect", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the terminal's width
    assert "2:4 sparsity: 5 of 7 layers eligible" in text and "1 already 2:4" in text


def test_the_summary_line_says_mac_shares_are_unknown_instead_of_zero(capsys) -> None:  # type: ignore[no-untyped-def]
    """Without concrete shapes a layer's MACs are unknown (round 12's hunt: a ViT with a dynamic batch read
    "73 of 101 layers eligible (0.0% of MACs could run sparse)")."""
    from trtopt.analysis.sparsity import LayerSparsity, SparsityReport
    from trtopt.cli.sparsity_tables import print_sparsity_report

    def layer(name: str, macs: int | None, eligible: bool = True) -> LayerSparsity:
        return LayerSparsity(name, "MatMul", "w", (64, 64), 0 if eligible else None, eligible,
                             "" if eligible else "too small", False, 0.0, macs)  # fmt: skip

    print_sparsity_report(SparsityReport((layer("a", None), layer("b", None), layer("c", 0, False)), 0))
    text = " ".join(capsys.readouterr().out.split())
    assert "2 of 3 layers eligible (their MACs unknown: pass --shapes); 0 already 2:4 (0.0% of MACs)" in text
    print_sparsity_report(SparsityReport((layer("a", 300), layer("b", None), layer("c", 100, False)), 400))
    text = " ".join(capsys.readouterr().out.split())
    assert "(75.0% of the known MACs could run sparse; 1 layers' MACs unknown: pass --shapes)" in text
