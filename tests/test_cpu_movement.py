"""trtopt.backend.cpu.movement: data movement between Q/DQ pairs runs on the quantised tensor, with outputs
identical (bit for bit, in ONNX Runtime) to the graph before, on hand-made attention-like graphs and random
chains of Transpose / Reshape / Squeeze / Unsqueeze / Slice / Gather."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS
from trtopt.backend.cpu.movement import MOVEMENT, move_quantisation


def _scalars(prefix: str, scale: float, zero: int) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.array(scale, np.float32), f"{prefix}_s"),
            numpy_helper.from_array(np.array(zero, np.uint8), f"{prefix}_z")]  # fmt: skip


def _pair(x: str, out: str, prefix: str) -> list[onnx.NodeProto]:
    return [helper.make_node("QuantizeLinear", [x, f"{prefix}_s", f"{prefix}_z"], [f"{out}_q"]),
            helper.make_node("DequantizeLinear", [f"{out}_q", f"{prefix}_s", f"{prefix}_z"], [out])]  # fmt: skip


def _run(model: onnx.ModelProto, x: np.ndarray, optimised: bool) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimised
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)  # fmt: skip
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=DISABLED_OPTIMIZERS if optimised else None)  # fmt: skip
    return session.run(None, {"x": x})


def _same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, x: np.ndarray, step: float = 0.07) -> None:
    """Bit for bit as ONNX defines the ops (no graph optimisation); within two steps of the coarsest grid as
    the CPU plan's runtime optimises them (its fusions requantise the two graphs' pairs in different places)."""
    onnx.checker.check_model(after, full_check=True)
    for want, got in zip(_run(before, x, False), _run(after, x, False), strict=True):
        np.testing.assert_array_equal(got, want)
    for want, got in zip(_run(before, x, True), _run(after, x, True), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=2 * step + 1e-6)


def _float_movement(model: onnx.ModelProto) -> list[str]:
    """Movement ops that read a DequantizeLinear's output: what the rewrite exists to remove."""
    made_by = {out: n.op_type for n in model.graph.node for out in n.output}
    return [n.name for n in model.graph.node if n.op_type in MOVEMENT and made_by.get(n.input[0]) == "DequantizeLinear"]


def _attention_like() -> onnx.ModelProto:
    """x [2, 6, 8] -> pair a -> MatMul -> pair b -> Reshape [2, 6, 2, 4] -> Transpose -> (Shape) -> Reshape
    [4, 6, 4] -> Mul by 0.5 -> pair c -> r3c; r3c -> Transpose -> pair c2 (c's grid) -> MatMul(r3c, that) -> y."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    shapes = [numpy_helper.from_array(np.array(s, np.int64), n) for n, s in (("s4", [2, 6, 2, 4]), ("s3", [4, 6, 4]))]
    nodes = [*_pair("x", "xa", "a"), helper.make_node("MatMul", ["xa", "w"], ["m"]), *_pair("m", "mb", "b"),
             helper.make_node("Reshape", ["mb", "s4"], ["r4"]),
             helper.make_node("Transpose", ["r4"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Shape", ["t"], ["shape"]), helper.make_node("Reshape", ["t", "s3"], ["r3"]),
             helper.make_node("Mul", ["r3", "half"], ["scaled"]), *_pair("scaled", "r3c", "c"),
             helper.make_node("Transpose", ["r3c"], ["kt"], perm=[0, 2, 1]), *_pair("kt", "ktc", "c2"),
             helper.make_node("MatMul", ["r3c", "ktc"], ["y"])]  # fmt: skip
    inits = [w, *shapes, numpy_helper.from_array(np.array(0.5, np.float32), "half"), *_scalars("a", 0.02, 128),
             *_scalars("b", 0.05, 128), *_scalars("c", 0.05, 128), *_scalars("c2", 0.05, 128)]  # fmt: skip
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6, 6]),
           helper.make_tensor_value_info("shape", TensorProto.INT64, [4])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 8])
    graph = helper.make_graph(nodes, "attention_like", [x], out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_attention_heads_move_quantised_with_the_same_outputs() -> None:
    model = _attention_like()
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    assert move_quantisation(moved) > 0
    assert _float_movement(model) and not _float_movement(moved)
    ops = [n.op_type for n in moved.graph.node]
    assert ops.count("QuantizeLinear") == 3, ops  # pair c2 met pair c's DQ on the same grid: the identity, gone
    x = np.random.default_rng(1).uniform(-3, 3, (2, 6, 8)).astype(np.float32)
    _same_outputs(model, moved, x)


_MOVES = st.sampled_from(["Transpose", "Reshape", "Squeeze+Unsqueeze", "Slice", "Gather", "Pad", "Identity", "Relu"])


@settings(max_examples=40, deadline=None)
@given(moves=st.lists(_MOVES, min_size=1, max_size=6), grids=st.lists(st.integers(0, 2), min_size=7, max_size=7),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_random_movement_chains_keep_their_outputs(moves: list[str], grids: list[int], seed: int) -> None:
    """A chain of movement ops (and Relus, which block the moves) over a [2, 3, 4, 5] tensor, a Q/DQ pair on one of
    three grids before each op or not: the moved graph computes the same bits, and no movement op that reads a
    per-tensor DQ is left."""
    rng = np.random.default_rng(seed)
    grid_values = [(0.03, 128), (0.03, 128), (0.07, 100)]
    inits = [t for i, (scale, zero) in enumerate(grid_values) for t in _scalars(f"g{i}", scale, zero)]
    nodes: list[onnx.NodeProto] = []
    name, shape = "x", [2, 3, 4, 5]
    for step, op in enumerate(moves):
        if grids[step]:
            nodes += _pair(name, f"p{step}", f"g{grids[step]}")
            name = f"p{step}"
        out = f"v{step}"
        if op == "Transpose":
            perm = [int(p) for p in rng.permutation(len(shape))]
            nodes.append(helper.make_node("Transpose", [name], [out], perm=perm))
            shape = [shape[p] for p in perm]
        elif op == "Reshape":
            shape = [int(np.prod(shape))] if len(shape) > 1 else [1, int(shape[0])]
            inits.append(numpy_helper.from_array(np.array(shape, np.int64), f"shape{step}"))
            nodes.append(helper.make_node("Reshape", [name, f"shape{step}"], [out]))
        elif op == "Squeeze+Unsqueeze":
            inits.append(numpy_helper.from_array(np.array([0], np.int64), f"axes{step}"))
            nodes += [helper.make_node("Unsqueeze", [name, f"axes{step}"], [f"u{step}"]),
                      helper.make_node("Squeeze", [f"u{step}", f"axes{step}"], [out])]  # fmt: skip
        elif op == "Pad":  # zeros on the last axis, written with the value 0.0 or without (it pads with the zero point)
            pads = [0] * len(shape) + [0] * (len(shape) - 1) + [2]
            inits += [numpy_helper.from_array(np.array(pads, np.int64), f"pads{step}"),
                      numpy_helper.from_array(np.array(0.0, np.float32), f"value{step}")]  # fmt: skip
            nodes.append(helper.make_node("Pad", [name, f"pads{step}", *([f"value{step}"] if step % 2 else [])], [out]))
            shape = [*shape[:-1], shape[-1] + 2]
        elif op in ("Slice", "Gather"):
            inits.append(numpy_helper.from_array(np.array([0], np.int64), f"zero{step}"))
            inits.append(numpy_helper.from_array(np.array([1], np.int64), f"one{step}"))
            inputs = [name, f"zero{step}", f"one{step}", f"zero{step}"] if op == "Slice" else [name, f"zero{step}"]
            nodes.append(helper.make_node(op, inputs, [out]))
            shape = [1, *shape[1:]]
        else:
            nodes.append(helper.make_node(op, [name], [out]))
        name = out
    nodes += _pair(name, "y", "g0")
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    move_quantisation(moved)
    assert not _float_movement(moved)
    _same_outputs(model, moved, rng.uniform(-4, 4, (2, 3, 4, 5)).astype(np.float32))


def test_a_pad_of_another_value_stays_float() -> None:
    """Padding with 1.0 writes a value that is no element of the input: it stays between its pairs."""
    inits = [*_scalars("g", 0.03, 128), numpy_helper.from_array(np.array([0, 0, 0, 1, 0, 0, 0, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]  # fmt: skip
    nodes = [*_pair("x", "a", "g"), helper.make_node("Pad", ["a", "pads", "one"], ["b"]), *_pair("b", "y", "g")]
    graph = helper.make_graph(nodes, "pad_one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 6])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert move_quantisation(model) == 0 and _float_movement(model)


def test_every_tensor_of_a_moved_graph_can_be_exposed_with_its_type() -> None:
    """The new quantised tensors are declared uint8: exposing every tensor as an output (what the sensitivity
    search and `compare --per-layer` do) once declared them float, and ONNX Runtime refused the model."""
    from trtopt.execution.ort_session import with_exposed_tensors

    moved = onnx.shape_inference.infer_shapes(_attention_like())  # every tensor of the model declared, as in a plan
    move_quantisation(moved)
    names = [out for node in moved.graph.node for out in node.output]
    exposed = with_exposed_tensors(moved, names)
    x = np.random.default_rng(2).uniform(-3, 3, (2, 6, 8)).astype(np.float32)
    values = dict(zip([o.name for o in exposed.graph.output], _run(exposed, x, False), strict=True))
    assert any(name.endswith("_quantised") for name in values)
    assert all(v.dtype == np.uint8 for name, v in values.items() if name.endswith(("_quantised", "_q")))
