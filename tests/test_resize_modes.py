"""--resize-mode stretch|letterbox (with --pad-value, --pad-align) next to the default 'shorter': the geometry,
the pixels, what the plan stores, and errors that are true for every command given the flags.

The model feeds its grey input straight to the output, so what a plan computes is what preprocessing made:

    input [1, 1, 16, 16] ─ Identity ─ pixels
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from PIL import Image

from trtopt.cli.main import main
from trtopt.data import PreprocessOverrides, PreprocessSpec, preprocess_image
from trtopt.data.resize import letterbox_offset, letterbox_size
from trtopt.errors import DataError
from trtopt.plan import read_plan


def wide_image() -> Image.Image:
    """8 rows x 16 columns: the left half 0, the right half 200."""
    pixels = np.zeros((8, 16), np.uint8)
    pixels[:, 8:] = 200
    return Image.fromarray(pixels, "L")


def spec(**fields: object) -> PreprocessSpec:
    return PreprocessSpec(crop=16, color="L", **fields)  # type: ignore[arg-type]


def test_letterbox_geometry_follows_ultralytics() -> None:
    assert letterbox_size(640, 480, (640, 640)) == (640, 480)
    assert letterbox_size(100, 300, (64, 64)) == (21, 64)  # round(100 * 64 / 300) = 21
    assert letterbox_size(10, 10, (64, 32)) == (32, 32)  # upscaling is allowed
    assert letterbox_offset((640, 480), (640, 640), "center") == (0, 80)
    assert letterbox_offset((21, 64), (64, 64), "center") == (21, 0)  # dw 21.5: round(21.4) left, 22 right
    assert letterbox_offset((21, 64), (64, 64), "top-left") == (0, 0)


@pytest.mark.parametrize(("align", "rows"), [("center", slice(4, 12)), ("top-left", slice(0, 8))])
def test_letterbox_pads_with_the_pixel_value_where_the_convention_says(align: str, rows: slice) -> None:
    sample = preprocess_image(wide_image(), spec(resize_mode="letterbox", pad_value=114, pad_align=align))[0]
    image = np.zeros((16, 16), bool)
    image[rows] = True
    assert (sample[~image] == 114).all()
    assert (sample[rows, :7] < 20).all() and (sample[rows, 9:] > 180).all()  # the image, aspect kept (x2)


def test_padding_goes_through_the_normalisation() -> None:
    s = spec(resize_mode="letterbox", pad_value=127.5, pad_align="top-left", scale=255.0, mean=(0.5,), std=(0.5,))
    sample = preprocess_image(wide_image(), s)[0]
    assert np.allclose(sample[8:], 0.0) and sample[0, 0] == pytest.approx(-1.0)


def test_stretch_ignores_the_aspect_ratio() -> None:
    sample = preprocess_image(wide_image(), spec(resize_mode="stretch"))[0]
    expected = np.asarray(wide_image().resize((16, 16), Image.Resampling.BILINEAR), np.float32)
    np.testing.assert_array_equal(sample, expected)


def test_default_mode_is_not_stored_and_old_plans_read_as_before() -> None:
    assert "resize_mode" not in spec().to_dict() and "pad_value" not in spec(resize_mode="stretch").to_dict()
    letterbox = spec(resize_mode="letterbox", pad_value=0, pad_align="top-left")
    assert PreprocessSpec.from_dict(letterbox.to_dict()) == letterbox
    with pytest.raises(DataError, match="resize_mode 'stretch' does not use"):
        PreprocessSpec(crop=16, resize=20, resize_mode="stretch")


def test_overrides_switch_mode_and_drop_the_presets_shorter_side() -> None:
    base = PreprocessSpec(crop=16, resize=18)
    result = PreprocessOverrides(resize_mode="letterbox", pad_value=0).apply(base)
    assert (result.resize_mode, result.resize, result.pad_value) == ("letterbox", None, 0.0)
    with pytest.raises(DataError, match="--pad-value .*the resize mode is shorter"):
        PreprocessOverrides(pad_value=0).apply(base)
    with pytest.raises(DataError, match="--resize 20 sets the shorter side.*--resize-mode letterbox"):
        PreprocessOverrides(resize=20, resize_mode="letterbox")
    with pytest.raises(DataError, match=r"--pad-value 300 is not accepted: it takes a pixel value from 0 to 255"):
        PreprocessOverrides(pad_value=300)


@pytest.fixture()
def identity_model(tmp_path):  # type: ignore[no-untyped-def]
    x = onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [1, 1, 16, 16])
    y = onnx.helper.make_tensor_value_info("pixels", onnx.TensorProto.FLOAT, [1, 1, 16, 16])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["input"], ["pixels"])], "id", [x], [y])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), tmp_path / "id.onnx")
    wide_image().save(tmp_path / "wide.png")
    return tmp_path


def test_build_stores_letterbox_and_run_and_compare_apply_it(identity_model, capsys) -> None:  # type: ignore[no-untyped-def]
    work = identity_model
    flags = ["--resize-mode", "letterbox", "--pad-value", "114", "--scale", "1", "--mean", "0", "--std", "1"]
    assert main(["build", str(work / "id.onnx"), "--backend", "cpu", "-o", str(work / "p.engine"), *flags]) == 0
    stored = read_plan(work / "p.engine").preprocess
    assert stored is not None and stored["resize_mode"] == "letterbox" and stored["pad_value"] == 114.0
    from trtopt.engine import Engine

    batch = Engine.load(work / "p.engine").preprocess([str(work / "wide.png")])
    assert (batch[0, 0, :4] == 114).all() and (batch[0, 0, 12:] == 114).all()
    capsys.readouterr()
    assert main(["run", str(work / "p.engine"), str(work / "wide.png"), "--pad-align", "top-left", "--json"]) == 0
    assert main(["compare", str(work / "id.onnx"), str(work / "p.engine"), "--data", str(work / "wide.png"),
                 "--pad-value", "0", "--json"]) == 0  # fmt: skip


@pytest.mark.parametrize("command", ["build", "run", "compare"])
def test_padding_flags_without_letterbox_are_refused_by_every_command(identity_model, capsys, command) -> None:  # type: ignore[no-untyped-def]
    work = identity_model
    grey = ["--mean", "0", "--std", "1"]
    assert main(["build", str(work / "id.onnx"), "--backend", "cpu", "-o", str(work / "p.engine"), *grey]) == 0
    capsys.readouterr()
    argv = {
        "build": ["build", str(work / "id.onnx"), "--backend", "cpu", "-o", str(work / "q.engine"), *grey],
        "run": ["run", str(work / "p.engine"), str(work / "wide.png")],
        "compare": ["compare", str(work / "id.onnx"), str(work / "p.engine"), "--data", str(work / "wide.png")],
    }[command]
    assert main([*argv, "--pad-value", "0"]) == 2
    err = capsys.readouterr().err
    assert "--pad-value set(s) the padding of a letterbox resize, but the resize mode is shorter" in err
    assert "--resize-mode letterbox" in err
