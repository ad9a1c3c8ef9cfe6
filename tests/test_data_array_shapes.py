"""Dynamic input sizes from an array file: with `--calib data.npz` and no `--shapes`, a model whose inputs
have dynamic dimensions past the batch is built for the sizes the arrays have (as LORE's transformer stage,
docs/holdout.md, [batch, cells, 256] and [batch, cells, 8], needed --shapes before).

    feat  [N, T, 16] ─ MatMul(W [16, 16]) ─┐
                                           Add ── out [N, T, 16]
    box   [N, T, 4]  ─ MatMul(B [4, 16]) ──┘
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtopt.cli.main import main
from trtopt.data.arrays import shapes_from_arrays
from trtopt.errors import DataError
from trtopt.plan import read_plan


def _model(path: Path) -> None:
    rng = np.random.default_rng(2)
    weights = [helper.make_tensor("W", TensorProto.FLOAT, [16, 16], rng.standard_normal(256).tolist()),
               helper.make_tensor("B", TensorProto.FLOAT, [4, 16], rng.standard_normal(64).tolist())]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["feat", "W"], ["a"]), helper.make_node("MatMul", ["box", "B"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["out"])]  # fmt: skip
    inputs = [helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", "T", 16]),
              helper.make_tensor_value_info("box", TensorProto.FLOAT, ["N", "T", 4])]  # fmt: skip
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "T", 16])
    graph = helper.make_graph(nodes, "cells", inputs, [output], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_sizes_come_from_the_arrays_headers(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", feat=np.zeros((5, 7, 16), np.float32), box=np.zeros((7, 4), np.float32))
    dims: dict[str, list[int | str | None]] = {"feat": ["N", "T", 16], "box": [None, None, 4], "mask": ["N", "T"]}
    # a batch of 5 (rank 3) and one sample (rank 2) alike; a named batch stays dynamic; "mask" has no array
    assert shapes_from_arrays(tmp_path / "d.npz", dims) == {"feat": ("N", 7, 16), "box": (1, 7, 4)}
    misfit = ("input 'feat' has shape [5, 7, 16], but the input [?, ?, 8] takes a stack of samples [N, ?, 8] (each "
              "fed as [?, ?, 8]) or one sample [?, 8]; ? is any size.")
    with pytest.raises(DataError, match=re.escape(misfit)):
        shapes_from_arrays(tmp_path / "d.npz", {"feat": [None, None, 8]})
    assert shapes_from_arrays(tmp_path / "d.npz", {"feat": [3, 7, 16]}) == {}  # nothing dynamic past the batch
    np.save(tmp_path / "one.npy", np.zeros((2, 3, 9), np.float32))
    assert shapes_from_arrays(tmp_path / "one.npy", {"x": [None, 3, None]}) == {"x": (1, 3, 9)}


def test_a_build_on_an_npz_needs_no_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "cells.npz", feat=rng.standard_normal((12, 6, 16)).astype(np.float32),
             box=rng.standard_normal((12, 6, 4)).astype(np.float32))  # fmt: skip
    argv = ["build", str(tmp_path / "m.onnx"), "--int8", "--backend", "cpu", "--calib", str(tmp_path / "cells.npz")]
    assert main([*argv, "-o", str(tmp_path / "m.engine"), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["verification"]["reference_vs_fp32"]["cosine"] > 0.99
    inputs = {s.name: s.shape for s in read_plan(tmp_path / "m.engine").inputs}
    assert inputs == {"feat": (-1, 6, 16), "box": (-1, 6, 4)}
    # --shapes still decides where given: the arrays then must fit it (here box's T of 5 contradicts the T of 6
    # that feat's array gives, and the model names both T)
    assert main([*argv, "-o", str(tmp_path / "x.engine"), "--shapes", "box:1x5x4"]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "names 'T' to 6 in input 'feat' and to 5 in input 'box'" in err and not (tmp_path / "x.engine").exists()
    assert main([*argv, "-o", str(tmp_path / "x.engine"), "--shapes", "box:1x5x4,feat:1x5x16"]) != 0
    assert "array 'feat' has shape [12, 6, 16]" in capsys.readouterr().err and not (tmp_path / "x.engine").exists()
    # images give no sizes: the error still asks for --shapes
    (tmp_path / "imgs").mkdir()
    assert main(["build", str(tmp_path / "m.onnx"), "--int8", "--calib", str(tmp_path / "imgs"), "-o",
                 str(tmp_path / "y.engine")]) != 0  # fmt: skip
    assert "--shapes" in capsys.readouterr().err
