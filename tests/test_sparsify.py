"""`trtopt sparsify`: the 2:4 magnitude pruner (structure, and numerics in ONNX Runtime against a mask applied
by hand), the fidelity measurements, the greedy budget and the command's report and errors.

The model (tests/sparsity_helpers.py) has five eligible layers (Convs with 8, 16 and 12 input channels, a
Gemm with transB, a MatMul) and two that are not (a depthwise conv, a conv with 6 input channels).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from sparsity_helpers import ELIGIBLE, NOT_ELIGIBLE, mask_by_hand, mixed_model, weights_of, with_masks_by_hand

from trtopt.analysis.sparsity import satisfies_24
from trtopt.cli.main import main
from trtopt.errors import TrtoptError
from trtopt.execution.ort_session import run_model
from trtopt.sparsify import FidelityProbe, sparsify


def batches(count: int = 4, seed: int = 0) -> list[tuple[dict[str, np.ndarray], int]]:
    rng = np.random.default_rng(seed)
    return [({"input": rng.standard_normal((1, 8, 10, 10)).astype(np.float32)}, 1) for _ in range(count)]


def test_every_eligible_layer_is_pruned_to_2_4_and_nothing_else_changes() -> None:
    model = mixed_model()
    result = sparsify(model)
    before, after = weights_of(model), weights_of(result.model)
    for layer, axis in ELIGIBLE.items():
        assert satisfies_24(after[layer], axis)
        keep = mask_by_hand(before[layer], axis)
        assert np.array_equal(after[layer][keep], before[layer][keep]) and not after[layer][~keep].any()
    for layer in NOT_ELIGIBLE:
        assert np.array_equal(after[layer], before[layer])
    pruned_weights = {n.input[1] for n in model.graph.node if n.name in ELIGIBLE}
    untouched = [t for t in model.graph.initializer if t.name not in pruned_weights]
    assert untouched == [t for t in result.model.graph.initializer if t.name not in pruned_weights]
    assert list(result.model.graph.node) == list(model.graph.node)
    assert {p.name for p in result.report.pruned} == set(ELIGIBLE)
    assert set(result.report.not_eligible) == set(NOT_ELIGIBLE)
    assert model.graph.initializer == mixed_model().graph.initializer  # the input model is left as it was


def test_pruned_model_computes_what_the_hand_masked_model_computes() -> None:
    """Numerics in ONNX Runtime: the pruned model's outputs equal, bit for bit, those of the original model
    with the same 2:4 mask applied by hand (tests/sparsity_helpers.py), and differ from the dense model's."""
    model = mixed_model(seed=3, batch=2)
    feeds = {"input": np.random.default_rng(1).standard_normal((2, 8, 10, 10)).astype(np.float32)}
    pruned = run_model(sparsify(model).model, feeds)["logits"]
    by_hand = run_model(with_masks_by_hand(model, ELIGIBLE), feeds)["logits"]
    assert np.array_equal(pruned, by_hand)
    assert not np.allclose(pruned, run_model(model, feeds)["logits"], atol=1e-3)
    partial = sparsify(model, layers=["conv_3", "matmul_1"]).model
    expected = with_masks_by_hand(model, {"conv_3": 1, "matmul_1": 0})
    assert np.array_equal(run_model(partial, feeds)["logits"], run_model(expected, feeds)["logits"])


def test_report_gives_the_share_of_weight_magnitude_removed() -> None:
    model = mixed_model()
    result = sparsify(model, layers=["gemm_1"])
    (layer,) = result.report.pruned
    weight = weights_of(model)["gemm_1"].astype(np.float64)
    removed = np.where(mask_by_hand(weight, 1), 0, weight)
    assert layer.l1_removed == pytest.approx(np.abs(removed).sum() / np.abs(weight).sum())
    assert layer.l2_removed == pytest.approx(np.linalg.norm(removed) / np.linalg.norm(weight))
    assert 0 < layer.l1_removed < layer.l2_removed < 1  # the removed half holds the small values
    assert result.pruned_mac_share == pytest.approx(layer.macs / result.total_macs)  # type: ignore[operator]


def test_fidelity_is_measured_with_the_compare_metrics() -> None:
    model = mixed_model()
    data = batches()
    same = FidelityProbe(model, data).measure(model)
    assert same.loss == pytest.approx(0.0, abs=1e-6) and same.top1 == 1.0
    result = sparsify(model, batches=data)
    assert result.fidelity is not None and 0 < result.fidelity.loss < 2
    reference = np.concatenate([run_model(model, f)["logits"] for f, _ in data]).ravel().astype(np.float64)
    pruned = np.concatenate([run_model(result.model, f)["logits"] for f, _ in data]).ravel().astype(np.float64)
    cosine = reference @ pruned / np.linalg.norm(reference) / np.linalg.norm(pruned)
    assert result.fidelity.loss == pytest.approx(1 - cosine, rel=1e-6)


def test_greedy_budget_takes_the_least_sensitive_layers_and_stays_within_it() -> None:
    model, data = mixed_model(), batches()
    everything = sparsify(model, batches=data).fidelity
    assert everything is not None
    budget = everything.loss / 3
    result = sparsify(model, budget=budget, batches=data)
    assert result.choice is not None and result.sensitivity is not None and result.fidelity is not None
    losses = [result.sensitivity[name].loss for name in result.choice.order]
    assert losses == sorted(losses) and set(result.choice.order) == set(ELIGIBLE)
    chosen = result.choice.chosen
    assert chosen == result.choice.order[: len(chosen)] and 0 < len(chosen) < len(ELIGIBLE)
    assert result.fidelity.loss <= budget < result.choice.measured[len(chosen) + 1]
    # measured with the weights fed as inputs of one session; a session over the written model rounds apart
    assert FidelityProbe(model, data).measure(result.model).loss == pytest.approx(result.fidelity.loss, abs=1e-6)
    assert {p.name for p in result.report.pruned} == set(chosen)
    assert not sparsify(model, budget=0.0, batches=data).report.pruned
    assert len(sparsify(model, budget=2.0, batches=data).report.pruned) == len(ELIGIBLE)


def test_layers_must_name_eligible_layers() -> None:
    with pytest.raises(TrtoptError, match="'nope'"):
        sparsify(mixed_model(), layers=["nope"])
    with pytest.raises(TrtoptError, match=r"'conv_2' \(1 input channels"):
        sparsify(mixed_model(), layers=["conv_3", "conv_2"])
    with pytest.raises(TrtoptError, match="needs data"):
        sparsify(mixed_model(), budget=0.01)


def test_a_weight_shared_by_two_layers_is_left_alone() -> None:
    model = mixed_model()
    conv_3 = next(n for n in model.graph.node if n.name == "conv_3")
    twin = onnx.helper.make_node("Conv", conv_3.input[:2], ["twin"], name="twin", kernel_shape=[1, 1])
    model.graph.node.append(twin)
    model.graph.output.append(onnx.helper.make_tensor_value_info("twin", onnx.TensorProto.FLOAT, None))
    result = sparsify(model)
    assert "shared" in result.report.not_eligible["conv_3"] and "conv_3" not in {p.name for p in result.report.pruned}


# --- the command -------------------------------------------------------------------------------------


def write_model_and_data(tmp_path: Path) -> tuple[Path, Path]:
    model_path = tmp_path / "mixed.onnx"
    onnx.save_model(mixed_model(), model_path)
    (tmp_path / "mixed.json").write_text('{"preprocess": null}')
    data = tmp_path / "data"
    data.mkdir()
    for i, (feeds, _) in enumerate(batches(6)):
        np.save(data / f"{i}.npy", feeds["input"][0])
    return model_path, data


def test_command_writes_the_pruned_model_its_sidecar_and_a_report(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model_path, data = write_model_and_data(tmp_path)
    out = tmp_path / "out" / "sparse.onnx"
    code = main(["sparsify", str(model_path), "-o", str(out), "--calib", str(data), "--max-loss", "0.5", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    weights = weights_of(onnx.load(out))
    assert {p["name"] for p in report["pruned"]} == set(report["budget"]["chosen"]) != set()
    assert all(satisfies_24(weights[p["name"]], ELIGIBLE[p["name"]]) for p in report["pruned"])
    assert report["fidelity"]["loss"] <= 0.5 and "fine-tuning" in report["note"]
    assert set(report["sensitivity"]) == set(ELIGIBLE) and report["not_eligible"].keys() == set(NOT_ELIGIBLE)
    assert (out.parent / "sparse.json").read_text() == '{"preprocess": null}'
    assert main(["sparsify", str(model_path), "-o", str(out), "--layers", "conv_1"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "pruned to 2:4: 1 layers" in text and "fine-tuning" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-loss", "0.01"], "--max-loss needs data"),
        (["--max-loss", "3", "--calib", "DATA"], "--max-loss is 3.0"),
        (["--layers", "conv_5"], "cannot be pruned to 2:4"),
        (["--calib", "DATA", "--batch", "0"], "--batch is 0"),
    ],
)
def test_command_errors_write_nothing(tmp_path: Path, capsys, extra: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    model_path, data = write_model_and_data(tmp_path)
    out = tmp_path / "sparse.onnx"
    args = [str(data) if a == "DATA" else a for a in extra]
    assert main(["sparsify", str(model_path), "-o", str(out), *args]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not out.exists() and not (tmp_path / "sparse.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "mixed.json", "mixed.onnx"]


def test_command_refuses_to_replace_a_different_sidecar(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model_path, _ = write_model_and_data(tmp_path)
    (tmp_path / "sparse.json").write_text('{"preprocess": {"preset": "tf"}}')
    assert main(["sparsify", str(model_path), "-o", str(tmp_path / "sparse.onnx")]) == 2
    assert "differs from the model's preprocessing sidecar" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "sparse.onnx").exists()


def test_pruned_weights_keep_their_dtype_and_name() -> None:
    model = mixed_model()
    result = sparsify(model, layers=["conv_1"])
    before = {t.name: t for t in model.graph.initializer}
    for tensor in result.model.graph.initializer:
        assert tensor.data_type == before[tensor.name].data_type
        assert numpy_helper.to_array(tensor).shape == numpy_helper.to_array(before[tensor.name]).shape


def test_weights_held_by_constant_nodes_are_pruned_and_measured_too() -> None:
    """Exporters sometimes write weights as Constant nodes instead of initializers: same result, and the
    fidelity probe (which feeds initializer weights as inputs) falls back to a session of its own."""
    model = mixed_model()
    weight = next(t for t in model.graph.initializer if t.name == "conv_w_3")
    model.graph.node.insert(0, onnx.helper.make_node("Constant", [], ["conv_w_3"], name="w3", value=weight))
    model.graph.initializer.remove(weight)
    data = batches()
    result = sparsify(model, budget=2.0, batches=data)
    assert "conv_3" in {p.name for p in result.report.pruned}
    feeds = data[0][0]
    expected = with_masks_by_hand(mixed_model(), ELIGIBLE)
    assert np.array_equal(run_model(result.model, feeds)["logits"], run_model(expected, feeds)["logits"])
    assert result.fidelity is not None
    assert FidelityProbe(model, data).measure(result.model).loss == pytest.approx(result.fidelity.loss, abs=1e-6)
