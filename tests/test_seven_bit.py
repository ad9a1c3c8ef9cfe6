"""7-bit weights (issue #45): the u8s7 CPU encoding, whose dense layers' weights lie on a 7-bit grid where the build
measured they cost little fidelity (trtopt.search.seven_bit), so that ONNX Runtime's fast u8s8 kernels run them exactly
on every x86 CPU (trtopt.backend.cpu.isa). The choice reads injected measurements; no test depends on timing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from model_files import tiny_model_with_images
from onnx import TensorProto, helper, numpy_helper
from quant_helpers import cpu_config, feeds_for, optimized_zoo_graph

from trtopt.backend.cpu.isa import EXACT_U8S8, SEVEN_BIT_MAX, cpu_isa, fits_seven_bits
from trtopt.backend.cpu.lowering import ENCODINGS, lower_for_cpu, store_unsigned_weights
from trtopt.backend.cpu.options import CpuOptions
from trtopt.backend.cpu.runner import model_for_this_cpu
from trtopt.build import BuildConfig, build_plan
from trtopt.cli.summaries import build_summary, print_build_summary
from trtopt.data import DataConfig
from trtopt.execution import run_model
from trtopt.frontend import onnx_from_graph
from trtopt.plan import read_plan, write_plan
from trtopt.quant import QuantConfig, insert_qdq, plan_quantization
from trtopt.quant.qdq import SEVEN_BIT, quantize_weight
from trtopt.search.seven_bit import TOLERANCE, choose_layers, dense_candidates, select


def _worst_case_conv(levels: int, channels: int = 32) -> onnx.ModelProto:
    """One 3x3 conv in the lowered CPU form, built to saturate 16-bit pair sums if anything does: uint8 activations
    at 255 everywhere meet weights at +-`levels`, the sign alternating by output channel::

        x ─ Q (uint8) ─ DQ ─ Conv (DQ of int8 weights, zero point 0) ─ Q (uint8, zero point 128) ─ DQ ─ y
    """
    weights = np.full((channels, channels, 3, 3), levels, np.int8) * np.where(np.arange(channels) % 2, -1, 1).astype(
        np.int8
    ).reshape(-1, 1, 1, 1)
    s_x, s_w = 1.0 / 255, np.full(channels, 0.01, np.float32)
    top = 255 * s_x * levels * 0.01 * channels * 9
    inits = [
        numpy_helper.from_array(np.array(s_x, np.float32), "sx"), numpy_helper.from_array(np.array(0, np.uint8), "zx"),
        numpy_helper.from_array(weights, "w"), numpy_helper.from_array(s_w, "sw"),
        numpy_helper.from_array(np.zeros(channels, np.int8), "zw"),
        numpy_helper.from_array(np.array(top / 127, np.float32), "sy"),
        numpy_helper.from_array(np.array(128, np.uint8), "zy"),
    ]  # fmt: skip
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["y"]),
    ]
    shape = [1, channels, 8, 8]
    graph = helper.make_graph(nodes, "worst_case", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_seven_bit_weights_are_exact_on_u8s8_kernels_on_every_cpu() -> None:
    """At the 7-bit grid's edge (and 64, the GEMM routing's q - 1), ONNX Runtime's u8s8 kernels equal the Q/DQ
    reference within one output step on any CPU kind; at 8 bits that is only what VNNI and AMX promise."""
    x = {"x": np.ones((1, 32, 8, 8), np.float32)}
    for levels in (SEVEN_BIT, SEVEN_BIT_MAX):
        model = _worst_case_conv(levels)
        assert store_unsigned_weights(model) == 0, "7-bit weights stay int8: their u8s8 kernels are exact"
        step = float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "sy")))
        kernels, reference = run_model(model, x)["y"], run_model(model, x, opt_level="disable")["y"]
        assert np.abs(kernels - reference).max() <= step * 1.001, levels
    eight = _worst_case_conv(127)
    if cpu_isa() in EXACT_U8S8:  # what VNNI / AMX promise: exact u8s8 sums at 8 bits too
        step = float(numpy_helper.to_array(next(t for t in eight.graph.initializer if t.name == "sy")))
        assert np.abs(run_model(eight, x)["y"] - run_model(eight, x, opt_level="disable")["y"]).max() <= step * 1.001
    assert store_unsigned_weights(eight) == 1, "8-bit weights go to uint8, which every CPU runs exactly"


def test_quantize_weight_on_the_seven_bit_grid() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    q, scale = quantize_weight(w, 0, levels=SEVEN_BIT)
    assert q.dtype == np.int8 and np.abs(q).max(axis=(1, 2, 3)).tolist() == [SEVEN_BIT] * 8 and fits_seven_bits(q)
    np.testing.assert_allclose(scale, np.abs(w).max(axis=(1, 2, 3)) / SEVEN_BIT, rtol=1e-6)
    assert np.abs(q * scale.reshape(-1, 1, 1, 1) - w).max() <= scale.max() / 2 * 1.0001
    q8, _ = quantize_weight(w, 0)
    assert not fits_seven_bits(q8)


@pytest.mark.parametrize("name", ["resnet_bottleneck", "mobilenetv2_block"])
def test_u8s7_plans_run_their_reference_on_this_cpu(name: str) -> None:
    """Every dense layer 7-bit (depthwise ones keep 8 bits: their kernel is exact): the lowered u8s7 plan stores
    them as int8 within 7 bits, the others as uint8, and its kernels equal its Q/DQ reference within a step."""
    graph = optimized_zoo_graph(name)
    config = cpu_config(QuantConfig(min_channels=1))
    plan = plan_quantization(graph, config)
    dense = tuple(dense_candidates(graph, plan.quantized_layers))
    assert dense and (len(dense) < len(plan.quantized_layers)) == (name == "mobilenetv2_block")  # its depthwise
    fp32 = onnx_from_graph(graph)
    feeds = feeds_for(graph, seed=1)
    acts = run_model(fp32, feeds, expose=plan.activation_tensors)
    amax = {t: float(np.abs(acts[t]).max()) for t in plan.activation_tensors}
    work = graph.copy()
    insert_qdq(work, plan, amax, seven_bit=dense)
    lowered = lower_for_cpu(onnx_from_graph(work), encoding="u8s7")
    inits = {t.name: numpy_helper.to_array(t) for t in lowered.graph.initializer}
    producers = {o: n for n in lowered.graph.node for o in n.output}
    kinds = {}
    for node in lowered.graph.node:
        if node.op_type == "Conv" and node.input[1] in producers:
            q = inits[producers[node.input[1]].input[0]]
            kinds[node.name] = (q.dtype, fits_seven_bits(q))
    assert all(kinds[n] == (np.int8, True) for n in dense), kinds
    assert all(not k[1] for n, k in kinds.items() if n not in dense), "depthwise convs keep 8-bit weights"
    kernels, reference = run_model(lowered, feeds), run_model(lowered, feeds, opt_level="disable")
    for out, ref in reference.items():
        step = np.abs(ref).max() / 127
        assert np.abs(kernels[out] - ref).max() <= 2 * step, out


def test_choose_layers_takes_the_cheapest_per_unit_of_work_within_the_budget() -> None:
    alone = {"a": 0.5, "b": 0.5, "c": 0.9, "d": 0.2}
    work = {"a": 100.0, "b": 10.0, "c": 1000.0, "d": 1.0}
    # per unit of work: c 0.00081, a 0.0025, b 0.025, d 0.04; squared costs 0.81, 0.25, 0.25, 0.04
    assert choose_layers(alone, work, 1.0) == ["c", "d"]  # c, then a would exceed 1; b too; d fits
    assert choose_layers(alone, work, 0.6) == ["a", "d"]  # c alone is over budget
    assert choose_layers({"a": float("inf")}, {"a": 1.0}) == []


def test_select_keeps_everything_when_it_is_within_budget() -> None:
    calls: list[tuple[str, ...]] = []

    def measure(layers):  # type: ignore[no-untyped-def]
        calls.append(tuple(layers))
        return 0.1 * len(layers)

    found = select(measure, ["a", "b", "c"], {"a": 1, "b": 1, "c": 1})
    assert found.layers == ("a", "b", "c") and found.trials == 1 and calls == [("a", "b", "c")]
    assert select(measure, [], {}).layers == ()


def test_select_measures_each_layer_and_cuts_back_a_set_over_budget() -> None:
    """Distances add in squares, except that four together overshoot (0.6 x 2): the set is cut back to three."""
    alone = {"a": 0.3, "b": 0.3, "c": 0.3, "d": 0.3, "e": 2.0}

    def measure(layers):  # type: ignore[no-untyped-def]
        total = float(np.sqrt(sum(alone[n] ** 2 for n in layers)))
        return total * (2.0 if len(layers) >= 4 else 1.0)  # an interaction the sum of squares misses

    found = select(measure, list(alone), dict.fromkeys(alone, 1.0))
    assert found.layers == ("a", "b", "c") and found.added_error <= TOLERANCE
    assert found.trials == 1 + len(alone) + 2  # all at once, each alone, two sets together


def test_select_gives_up_when_no_set_is_within_budget() -> None:
    found = select(lambda layers: 5.0, ["a", "b"], {"a": 1.0, "b": 1.0})
    assert found.layers == () and found.candidates == 2


def test_the_u8s7_encoding_asks_for_the_search_and_the_others_do_not() -> None:
    from trtopt.backend import get_backend

    cpu = get_backend("cpu")
    assert ENCODINGS["u8s7"].seven_bit and not ENCODINGS["u8u8"].seven_bit and not ENCODINGS["u8s8"].seven_bit
    assert cpu.quant_config(QuantConfig(), CpuOptions(encoding="u8s7")).seven_bit_search
    assert not cpu.quant_config(QuantConfig(), CpuOptions(encoding="u8u8")).seven_bit_search
    assert not cpu.quant_config(QuantConfig()).seven_bit_search  # without options: placement only
    assert not get_backend("tensorrt").quant_config(QuantConfig(), None).seven_bit_search


@pytest.fixture(scope="module")
def u8s7_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    root = tiny_model_with_images(tmp_path_factory.mktemp("u8s7"), 16)
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(root / "images"),)),
                         quant=QuantConfig(min_channels=1, auto_exclude=False),
                         backend_options=(CpuOptions(encoding="u8s7", fallback="off"),))  # fmt: skip
    result = build_plan(root / "tiny.onnx", config)
    return write_plan(result.plan, root / "tiny.engine"), result


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    return {n.name: inits[producers[n.input[1]].input[0]] for n in model.graph.node
            if n.op_type in ("Conv", "Gemm") and n.input[1] in producers and producers[n.input[1]].input[0] in inits}


def test_a_u8s7_build_records_its_choice_verifies_and_round_trips(u8s7_plan, capsys) -> None:  # type: ignore[no-untyped-def]
    path, result = u8s7_plan
    plan = result.plan
    record = plan.metadata.extra["seven_bit_weights"]
    assert record["candidates"] >= 1 and set(record["layers"]) <= set(plan.metadata.quant.int8_layers)
    assert plan.metadata.verification.ok and plan.metadata.verification.variant == "u8s7"
    weights = _weights(onnx.load_from_string(plan.sections["onnx"]))
    for name in record["layers"]:
        assert weights[name].dtype == np.int8 and fits_seven_bits(weights[name]), name
    loaded = read_plan(path)
    assert loaded.sections["onnx"] == plan.sections["onnx"] and loaded.metadata.extra == plan.metadata.extra
    summary = build_summary(result, path)  # the build summary names what it chose
    assert summary["seven_bit_weights"]["layers"] == record["layers"]
    print_build_summary(summary, "cpu")
    assert "7-bit weights" in capsys.readouterr().out
    # On load, a saturating CPU re-encodes only 8-bit weights; an exact one runs the plan as stored.
    for isa in ("avx2", "avx512_vnni"):
        again = _weights(onnx.load_from_string(model_for_this_cpu(loaded, isa)))
        assert all(again[n].dtype == np.int8 and np.array_equal(again[n], weights[n]) for n in record["layers"])


def test_a_u8s8_plan_loaded_on_a_saturating_cpu_keeps_its_meaning(u8s7_plan) -> None:  # type: ignore[no-untyped-def]
    """A plan with 8-bit int8 weights (built for VNNI) is re-encoded to uint8 on AVX2: same reference, exact kernels."""
    from dataclasses import replace

    _, result = u8s7_plan
    model = onnx.load_from_string(result.plan.sections["onnx"])
    vnni = replace(result.plan, sections={"onnx": lower_for_cpu_again(model)})
    encoded = onnx.load_from_string(model_for_this_cpu(vnni, "avx2"))
    before, after = _weights(onnx.load_from_string(vnni.sections["onnx"])), _weights(encoded)
    for name, q in before.items():
        assert (after[name].dtype == np.int8) == fits_seven_bits(q) if q.dtype == np.int8 else True
    spec = result.plan.inputs[0]
    shape = [d if d > 0 else 1 for d in spec.shape]
    feeds = {spec.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    a = run_model(onnx.load_from_string(vnni.sections["onnx"]), feeds, opt_level="disable")
    b = run_model(encoded, feeds, opt_level="disable")
    assert all(np.array_equal(a[k], b[k]) for k in a), "re-encoding changes the storage, not the values"


def lower_for_cpu_again(model: onnx.ModelProto) -> bytes:
    """The u8s7 plan's ONNX with its uint8 weights back in int8 (q - 128, zero point 0): the u8s8 storage."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    inits = {t.name: t for t in copy.graph.initializer}
    for dq in (n for n in copy.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits):
        q, zero = inits[dq.input[0]], inits.get(dq.input[2]) if len(dq.input) > 2 else None
        if q.data_type == TensorProto.UINT8 and zero is not None and len(q.dims) > 1:
            values = numpy_helper.to_array(q).astype(np.int16) - 128
            q.CopyFrom(numpy_helper.from_array(values.astype(np.int8), dq.input[0]))
            zero.CopyFrom(numpy_helper.from_array(np.zeros(numpy_helper.to_array(zero).shape, np.int8), dq.input[2]))
    return copy.SerializeToString()


def test_added_error_counts_what_narrowing_adds_to_the_eight_bit_error() -> None:
    from trtopt.search.seven_bit import added_error

    assert added_error(0.01, 0.01) == 0.0 and added_error(0.005, 0.01) == 0.0  # no worse: adds nothing
    assert added_error(np.sqrt(2) * 0.01, 0.01) == pytest.approx(TOLERANCE)  # the budget: 1.41x the 8-bit error
    assert added_error(float("nan"), 0.01) == float("inf")
