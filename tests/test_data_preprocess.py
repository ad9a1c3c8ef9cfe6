"""Preprocessing: presets against hand-computed values, geometry of resize + centre crop, layouts, dtypes,
spec serialisation and validation, and deriving a spec from a model input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trtopt.data import PRESETS, PreprocessSpec, preprocess_image, preprocess_images, spec_for_input
from trtopt.data.preprocess import resized_size
from trtopt.errors import DataError, ShapeError, UnknownNameError

C = np.array([200.0, 100.0, 50.0])  # a solid RGB colour
SOLID = Image.new("RGB", (12, 10), (200, 100, 50))


def _run(preset: str, **changes: object) -> np.ndarray:
    spec = dataclasses.replace(PRESETS.get(preset), crop=4, **changes)  # type: ignore[arg-type]
    out = preprocess_image(SOLID, spec)
    assert out.shape == spec.sample_shape
    return out


def _channels(out: np.ndarray) -> np.ndarray:
    assert (out == out[:, :1, :1]).all(), "a solid image must stay solid"
    return out[:, 0, 0]


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("imagenet", (C / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])),
        ("tf", (C - 127.5) / 127.5),
        ("inception", (C - 127.5) / 127.5),
        ("efficientnet-lite", (C - 127.0) / 128.0),
        ("caffe", C[::-1] - np.array([103.939, 116.779, 123.68])),  # BGR order
        ("unit", C / 255),
        ("raw", C),
    ],
)
def test_presets_match_hand_computed_values(preset: str, expected: np.ndarray) -> None:
    out = _run(preset)
    assert out.dtype == np.float32
    np.testing.assert_allclose(_channels(out), expected.astype(np.float32), rtol=1e-6, atol=1e-6)


def test_imagenet_is_exact_to_float32_rounding() -> None:
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    np.testing.assert_array_equal(_channels(_run("imagenet")), ((C / 255 - mean) / std).astype(np.float32))


def test_all_presets_are_registered_and_unknown_names_list_them() -> None:
    assert set(PRESETS.names()) == {
        "imagenet",
        "tf",
        "inception",
        "efficientnet-lite",
        "caffe",
        "unit",
        "raw",
    }
    with pytest.raises(UnknownNameError, match="imagenet"):
        PRESETS.get("imagenett")


def test_nhwc_is_the_transpose_of_nchw() -> None:
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    spec = dataclasses.replace(PRESETS.get("imagenet"), crop=(8, 12))
    nchw = preprocess_image(noise, spec)
    nhwc = preprocess_image(noise, dataclasses.replace(spec, layout="NHWC"))
    assert nchw.shape == (3, 8, 12) and nhwc.shape == (8, 12, 3)
    np.testing.assert_array_equal(nchw.transpose(1, 2, 0), nhwc)


def test_float16_and_uint8_outputs() -> None:
    half = _run("unit", dtype="float16")
    assert half.dtype == np.float16
    np.testing.assert_array_equal(_channels(half), (C / 255).astype(np.float16))
    raw = _run("raw", dtype="uint8", layout="NHWC")
    assert raw.dtype == np.uint8 and raw[0, 0].tolist() == [200, 100, 50]


def test_uint8_refuses_normalisation() -> None:
    with pytest.raises(DataError, match="uint8.*raw"):
        dataclasses.replace(PRESETS.get("imagenet"), dtype="uint8")


def _marked(width: int, height: int, x: int, y: int) -> Image.Image:
    img = Image.new("RGB", (width, height), (0, 0, 0))
    img.putpixel((x, y), (255, 0, 0))
    return img


@pytest.mark.parametrize(
    ("size", "marker", "expected"),
    [((30, 20), (12, 3), (3, 7)), ((20, 30), (3, 12), (7, 3))],  # (w, h), (x, y), (row, col) in output
    ids=["landscape", "portrait"],
)
def test_centre_crop_geometry_without_resize(size, marker, expected) -> None:
    # Shorter side already equals `resize`, so only the centre crop moves the marker: offset
    # round((30 - 20) / 2) = 5 along the longer side.
    spec = PreprocessSpec(crop=20, resize=20, layout="NHWC")
    out = preprocess_image(_marked(*size, *marker), spec)
    assert out.shape == (20, 20, 3)
    red = np.argwhere(out[:, :, 0] > 0)
    assert red.tolist() == [list(expected)]


def test_resize_then_crop_geometry() -> None:
    # 200 x 100 -> shorter side 50 -> 100 x 50 -> centre crop 50 x 50 starts at x = 25.
    img = Image.new("RGB", (200, 100), (0, 0, 0))
    img.paste(
        (255, 0, 0), (100, 20, 120, 40)
    )  # maps to x 50..60, y 10..20 after resizing, x 25..35 after crop
    out = preprocess_image(img, PreprocessSpec(crop=50, resize=50, layout="NHWC"))
    assert out.shape == (50, 50, 3)
    assert out[15, 30, 0] == 255 and out[15, 30, 1] == 0
    assert out[15, 10, 0] == 0 and out[45, 30, 0] == 0
    rows, cols = np.nonzero(out[:, :, 0] > 127)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (10, 19, 25, 34)


def test_resize_defaults_and_rules() -> None:
    assert PreprocessSpec(crop=224).resize_short == 256
    assert PreprocessSpec(crop=299).resize_short == 342
    assert PreprocessSpec(crop=(224, 160)).resize_short == 256
    assert resized_size(640, 480, 256, (224, 224)) == (341, 256)  # torchvision truncates the long side
    # A tall crop on a very wide image: scaled up until the crop fits, instead of padding.
    assert resized_size(100, 10, 4, (16, 4)) == (160, 16)
    out = preprocess_image(Image.new("RGB", (100, 10)), PreprocessSpec(crop=(16, 4), resize=4))
    assert out.shape == (3, 16, 4)


def test_interpolation_is_deterministic_and_matters() -> None:
    noise = Image.fromarray(np.random.default_rng(1).integers(0, 256, (37, 53, 3), dtype=np.uint8))
    bilinear = PreprocessSpec(crop=16)
    bicubic = dataclasses.replace(bilinear, interpolation="bicubic")
    np.testing.assert_array_equal(preprocess_image(noise, bilinear), preprocess_image(noise, bilinear))
    assert not np.array_equal(preprocess_image(noise, bilinear), preprocess_image(noise, bicubic))


def test_grey_spec_and_any_input_mode() -> None:
    spec = PreprocessSpec(crop=4, color="L", scale=255.0)
    out = preprocess_image(Image.new("RGBA", (6, 6), (255, 255, 255, 0)), spec)  # transparent -> white
    assert out.shape == (1, 4, 4)
    np.testing.assert_array_equal(out, np.ones((1, 4, 4), np.float32))


def test_preprocess_images_accepts_images_paths_and_arrays(tmp_path: Path) -> None:
    path = tmp_path / "solid.png"
    SOLID.save(path)
    hwc = np.asarray(SOLID)
    grey = np.full((10, 12), 7, np.uint8)
    spec = PreprocessSpec(crop=4, layout="NHWC")
    batch = preprocess_images([SOLID, path, str(path), hwc, grey], spec)
    assert batch.shape == (5, 4, 4, 3) and batch.dtype == np.float32
    for sample in batch[:4]:
        assert sample[0, 0].tolist() == [200, 100, 50]
    assert batch[4, 0, 0].tolist() == [7, 7, 7]
    assert preprocess_images([], spec).shape == (0, 4, 4, 3)


@pytest.mark.parametrize(
    "bad", [np.zeros((4, 4, 3), np.float32), np.zeros((4, 4, 4), np.uint8), 42], ids=["float", "4ch", "int"]
)
def test_preprocess_images_rejects_other_things(bad) -> None:
    with pytest.raises(DataError, match="Image 1"):
        preprocess_images([SOLID, bad], PreprocessSpec(crop=4))


def test_spec_round_trips_through_json() -> None:
    for name in PRESETS:
        spec = dataclasses.replace(PRESETS.get(name), crop=(200, 180), layout="NHWC", resize=230)
        data = json.loads(json.dumps(spec.to_dict()))
        assert PreprocessSpec.from_dict(data) == spec
    assert PreprocessSpec.from_dict({"crop": 8}) == PreprocessSpec(crop=(8, 8))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([1, 2], "expected a JSON object"),
        ({"crop": 8, "colour": "RGB"}, r"unknown preprocessing field.*colour.*Valid fields"),
        ({"crop": 0}, "'crop' is 0; expected a positive integer"),
        ({"crop": [8, 8, 8]}, "'crop'.*height, width"),
        ({"layout": "CHW"}, "'layout' is 'CHW'; expected one of 'NCHW', 'NHWC'"),
        ({"dtype": "int8"}, "'dtype'"),
        ({"interpolation": "lanczos"}, "'interpolation'"),
        ({"mean": [0.1, 0.2]}, "'mean'.*1 or 3 numbers"),
        ({"std": [1.0, 0.0, 1.0]}, "'std'.*non-zero"),
        ({"scale": -1}, "'scale'.*positive"),
        ({"resize": True}, "'resize'.*positive integer"),
        ({"mean": ["a", 1, 2]}, "'mean'"),
    ],
)
def test_from_dict_explains_bad_fields(data: object, match: str) -> None:
    with pytest.raises(DataError, match=match) as info:
        PreprocessSpec.from_dict(data, where="plan.trt")
    assert str(info.value).startswith("plan.trt: ")


def test_spec_for_input_reads_size_and_layout() -> None:
    nchw = spec_for_input(["N", 3, 224, 200], np.float32, "imagenet")  # not square: the shorter side at the input's
    assert (nchw.layout, nchw.crop_hw, nchw.dtype, nchw.resize_short) == ("NCHW", (224, 200), "float32", 200)
    assert nchw.mean == PRESETS.get("imagenet").mean
    nhwc = spec_for_input([1, 299, 299, 3], "float16", "inception")
    assert (nhwc.layout, nhwc.crop_hw, nhwc.dtype, nhwc.sample_shape) == (
        "NHWC",
        (299, 299),
        "float16",
        (299, 299, 3),
    )


def test_an_image_of_a_non_square_inputs_size_is_fed_as_it_is() -> None:
    """ImageNet's shorter side at crop / 0.875 zoomed a fingerprint model's 384 x 320 images 1.37x and cut a quarter
    of their width off (afis's LEADER, round 13's hunt); square inputs keep that rule."""
    from PIL import Image

    from trtopt.data.preprocess import preprocess_image

    spec = spec_for_input([1, 384, 320, 1], np.float32, "raw")
    pixels = np.random.default_rng(0).integers(0, 256, (384, 320), dtype=np.uint8)
    np.testing.assert_array_equal(preprocess_image(Image.fromarray(pixels), spec)[..., 0], pixels.astype(np.float32))
    wide = preprocess_image(Image.fromarray(np.zeros((100, 300), np.uint8)), spec)  # another shape: covered, cropped
    assert wide.shape == (384, 320, 1)
    assert spec_for_input([1, 3, 224, 224], np.float32).resize_short == 256  # 224 / 0.875
    assert spec_for_input([1, 384, 320, 1], np.float32, "raw", resize=400).resize == 400  # a given size stays


def test_spec_for_input_defaults_and_overrides() -> None:
    assert spec_for_input([1, 3, 8, 8], np.float32).mean == PRESETS.get("imagenet").mean
    raw = spec_for_input([1, 8, 8, 3], np.uint8)
    assert (raw.dtype, raw.scale, raw.mean, raw.std) == ("uint8", 1.0, (0.0,), (1.0,))
    spec = spec_for_input(
        [1, 3, 8, 8],
        np.float32,
        "imagenet",
        resize=9,
        interpolation="bicubic",
        mean=[0.5],
        std=[0.25],
        scale=1.0,
    )
    assert (spec.resize, spec.interpolation, spec.mean, spec.std, spec.scale) == (
        9,
        "bicubic",
        (0.5,),
        (0.25,),
        1.0,
    )
    assert spec_for_input([1, 3, 8, 8], np.float32, "caffe").color == "BGR"


def test_spec_for_input_grey_models() -> None:
    grey = spec_for_input([1, 1, 28, 28], np.float32, "tf")
    assert (grey.color, grey.mean, grey.std, grey.sample_shape) == ("L", (0.5,), (0.5,), (1, 28, 28))
    with pytest.raises(DataError, match="1 \\(grey\\) channel.*mean"):
        spec_for_input([1, 1, 28, 28], np.float32, "imagenet")
    assert spec_for_input([1, 1, 28, 28], np.float32, "imagenet", mean=[0.5], std=[0.5]).color == "L"


def test_spec_for_input_ambiguous_layout_asks_for_it() -> None:
    with pytest.raises(ShapeError, match="--layout") as info:
        spec_for_input([1, 3, 3, 3], np.float32)
    assert "[1, 3, 3, 3]" in str(info.value)
    assert spec_for_input([1, 3, 3, 3], np.float32, layout="NHWC").layout == "NHWC"
    with pytest.raises(ShapeError, match="Layout NHWC"):
        spec_for_input([1, 3, 224, 224], np.float32, layout="NHWC")


@pytest.mark.parametrize(
    ("shape", "dtype", "error", "match"),
    [
        ([1, 3, "H", "W"], np.float32, ShapeError, "dynamic height or width.*--shapes input:1x3x224x224"),
        ([1, 224, 224], np.float32, ShapeError, "4-D"),
        ([1, 5, 224, 224], np.float32, ShapeError, "no channel dimension"),
        ([1, 3, 224, 224], np.int64, DataError, "int64.*npy"),
    ],
)
def test_spec_for_input_rejects_non_image_inputs(shape, dtype, error, match) -> None:
    with pytest.raises(error, match=match):
        spec_for_input(shape, dtype)


def _photo(path: Path, size: tuple[int, int], orientation: int | None = None) -> Path:
    """A smooth gradient with sensor-like noise, saved as a JPEG (quality 90), like a camera photo."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    noisy = base + np.random.default_rng(0).normal(0, 6, base.shape)
    image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(path, quality=90, exif=exif.tobytes())
    return path


def test_large_jpegs_decode_at_a_reduced_size_within_tolerance(tmp_path: Path) -> None:
    """DCT-domain downscaling (Pillow's draft) then the exact resize: the same sample within a few levels
    (issue #18). 1600x1200 for a 64 px crop (resize 73) decodes at 1/8 scale, 200x150."""
    from trtopt.data import read_image
    from trtopt.data.preprocess import preprocess_file

    path = _photo(tmp_path / "big.jpg", (1600, 1200))
    drafted = read_image(path, draft=lambda w, h: resized_size(w, h, 73, (64, 64)))
    assert drafted.size == (200, 150)
    spec = PreprocessSpec(crop=64)  # raw 0..255 floats
    exact = preprocess_image(read_image(path), spec)
    fast = preprocess_file(path, spec)
    assert fast.shape == exact.shape == spec.sample_shape
    diff = np.abs(fast - exact)
    assert diff.mean() < 1.0 and diff.max() <= 12, (diff.mean(), diff.max())
    np.testing.assert_array_equal(preprocess_images([path], spec)[0], fast)  # Engine.preprocess's path
    # the same file's bytes (an upload, a Triton request) decode as the file does, draft included
    np.testing.assert_array_equal(preprocess_images([path.read_bytes()], spec)[0], fast)
    with pytest.raises(DataError, match="Cannot read image 1 \\(encoded bytes\\)"):
        preprocess_images([path, b"not an image"], spec)


def test_draft_keeps_exif_orientation_and_leaves_small_or_other_images_exact(tmp_path: Path) -> None:
    from trtopt.data import read_image
    from trtopt.data.preprocess import preprocess_file

    spec = PreprocessSpec(crop=(48, 32))
    rotated = _photo(tmp_path / "rotated.jpg", (1600, 1200), orientation=6)  # stored sideways: upright 1200x1600
    assert read_image(rotated, draft=lambda w, h: (w // 8, h // 8)).size == (150, 200)
    diff = np.abs(preprocess_file(rotated, spec) - preprocess_image(read_image(rotated), spec))
    assert diff.mean() < 1.0
    small = _photo(tmp_path / "small.jpg", (100, 70))  # within 2x of the target: decoded in full
    png = tmp_path / "big.png"
    Image.open(_photo(tmp_path / "big2.jpg", (800, 600))).save(png)  # not a JPEG: decoded in full
    for path in (small, png):
        np.testing.assert_array_equal(preprocess_file(path, spec), preprocess_image(read_image(path), spec))
