"""The sensitivity search measures each plan in the form its backend builds (`Backend.measured_form`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
from test_quant_sensitivity import _captured_build

from trtopt.backend import get_backend
from trtopt.backend.cpu.builder import DISABLED_OPTIMIZERS
from trtopt.data.dataset import sample_batches
from trtopt.execution import OrtSession
from trtopt.execution.ort_session import session_options
from trtopt.frontend import onnx_from_graph
from trtopt.search._trials import DownstreamTrials, output_figures, worst_cosine
from trtopt.search.sensitivity import SAMPLES, quantized_model
from trtopt.verify import collect


def _built_cosine(section: bytes, batches: Any, expected: Any) -> float:
    """The worst output cosine of a built CPU plan's ONNX run as the CPU runner runs it (ONNX Runtime's
    optimisations on: its fused INT8 kernels)."""
    session = ort.InferenceSession(section, session_options(threads=1), providers=["CPUExecutionProvider"],
                                   disabled_optimizers=DISABLED_OPTIMIZERS)  # fmt: skip
    names = [o.name for o in session.get_outputs()]
    runs = [dict(zip(names, session.run(names, dict(feeds)), strict=True)) for feeds, _rows in batches]
    return float(output_figures(runs, batches, expected).min())


def test_the_build_hands_the_search_its_backends_measured_form(tmp_path: Path, monkeypatch: Any) -> None:
    """The CPU build measures the lowered graph its builder writes; TensorRT's form is measured as it is."""
    seen = _captured_build(tmp_path, monkeypatch)
    graph, quant, calibration = seen["graph"], seen["quant"], seen["calibration"]
    qdq = quantized_model(graph, quant, calibration, True)
    cpu = get_backend("cpu")
    built = onnx.load_from_string(cpu.build(qdq, cpu.options_type())[0]["onnx"])
    measured = quantized_model(graph, quant, calibration, True, lower=seen["lower"])
    assert measured.SerializeToString() == built.SerializeToString() != qdq.SerializeToString()
    trt = get_backend("tensorrt")
    assert trt.measured_form(qdq, None) is qdq


def test_a_trial_measures_the_cosine_of_the_cpu_plan_as_built_and_run(tmp_path: Path, monkeypatch: Any) -> None:
    """Each layer kept float alone, measured by the cut trial on the lowered form, scores what the CPU
    backend's real plan scores when ONNX Runtime runs it; measured in TensorRT's form it would not."""
    seen = _captured_build(tmp_path, monkeypatch)
    graph, quant, calibration, lower = seen["graph"], seen["quant"], seen["calibration"], seen["lower"]
    layers = list(seen["plan"].quantized_layers)
    batches = sample_batches(seen["data"], 8, SAMPLES)
    expected = collect(OrtSession(onnx_from_graph(graph)).run, batches)
    cpu = get_backend("cpu")
    trials = DownstreamTrials(quantized_model(graph, quant, calibration, True, lower=lower), batches, layers)
    apart = []
    for exclude in [(layer,) for layer in layers]:
        qdq = quantized_model(graph, quant, calibration, True, exclude)
        built = _built_cosine(cpu.build(qdq, cpu.options_type())[0]["onnx"], batches, expected)
        measured = output_figures(trials.run(quantized_model(graph, quant, calibration, True, exclude, lower)),
                                  batches, expected).min()  # fmt: skip
        assert abs(measured - built) < 1e-6, (exclude, measured, built)
        apart.append(abs(worst_cosine(qdq, batches, expected) - built))
    assert max(apart) > 1e-5  # TensorRT's form scores otherwise: the test tells the two forms apart


def test_a_cut_trial_of_the_lowered_form_measures_the_whole_lowered_graph(tmp_path: Path, monkeypatch: Any) -> None:
    """Lowering keeps the trials' content fingerprints sound: every cut trial (whole cache and none kept)
    scores what its whole lowered graph scores, and the last layer's trial still runs a small part."""
    seen = _captured_build(tmp_path, monkeypatch)
    graph, quant, calibration, lower = seen["graph"], seen["quant"], seen["calibration"], seen["lower"]
    layers = list(seen["plan"].quantized_layers)
    batches = sample_batches(seen["data"], 8, SAMPLES)
    expected = collect(OrtSession(onnx_from_graph(graph)).run, batches)
    base = quantized_model(graph, quant, calibration, True, lower=lower)
    cached, bare = DownstreamTrials(base, batches, layers), DownstreamTrials(base, batches, layers, budget=0)
    trials = [(layer,) for layer in layers] + [(a, b) for a, b in zip(layers, layers[1:], strict=False)]
    for exclude in trials:
        model = quantized_model(graph, quant, calibration, True, exclude, lower)
        whole = worst_cosine(model, batches, expected)
        for trial in (cached, bare):
            assert abs(output_figures(trial.run(model), batches, expected).min() - whole) < 1e-9, exclude
    cached.nodes_run = 0
    cached.run(quantized_model(graph, quant, calibration, True, (layers[-1],), lower))
    assert 0 < cached.nodes_run < len(base.graph.node) // 2


def test_per_sample_cosines_are_those_whose_mean_the_search_measures() -> None:
    """`sample_cosines` gives each output's cosine sample by sample, a row per output (padded batch rows
    dropped); `output_figures` each output's figure, the lower of the mean of that row and the output's
    all-element cosine, whose lowest is the search's figure (`worst_cosine`'s)."""
    import numpy as np

    from trtopt.search._trials import output_figures, sample_cosines

    rng = np.random.default_rng(0)
    want = {"a": rng.normal(size=(5, 7)), "b": rng.normal(size=(5, 3))}
    noise = {"a": 0.1, "b": 1.0}  # "b" is the worse output
    got = {k: v + rng.normal(scale=noise[k], size=v.shape) for k, v in want.items()}
    batches = [({}, 4), ({}, 1)]
    pad = np.zeros((3, 7)), np.zeros((3, 3))
    outputs = [{"a": got["a"][:4], "b": got["b"][:4]},
               {"a": np.concatenate([got["a"][4:], pad[0]]), "b": np.concatenate([got["b"][4:], pad[1]])}]  # fmt: skip
    cosines = sample_cosines(outputs, batches, want)
    figures = output_figures(outputs, batches, want)
    assert cosines.shape == (2, 5) and figures.shape == (2,)
    for row, name in enumerate(want):
        g, w = got[name], want[name]
        ref = np.sum(g * w, 1) / np.linalg.norm(g, axis=1) / np.linalg.norm(w, axis=1)
        assert np.allclose(cosines[row], ref)
        whole = float(g.ravel() @ w.ravel()) / np.linalg.norm(g) / np.linalg.norm(w)
        assert abs(min(float(ref.mean()), whole) - figures[row]) < 1e-12
    assert figures[1] < figures[0]
