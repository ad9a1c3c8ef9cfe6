"""Reading images: every format, EXIF orientation, every pixel mode, and clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from trtopt.data import IMAGE_EXTENSIONS, UnreadableFileError, read_image, rgb_from_image
from trtopt.data.images import check_image_header
from trtopt.errors import DataError

COLOUR = (200, 100, 50)


def _pixels(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    return np.asarray(img).astype(int)


@pytest.mark.parametrize("ext", IMAGE_EXTENSIONS + (".JPG", ".PNG"))
def test_every_format_reads_as_rgb(tmp_path: Path, ext: str) -> None:
    path = tmp_path / f"solid{ext}"
    options = {"lossless": True} if ext == ".webp" else {}
    Image.new("RGB", (16, 12), COLOUR).save(path, **options)
    img = read_image(path)
    assert img.size == (16, 12)
    lossy = ext.lower() in (".jpg", ".jpeg")
    np.testing.assert_allclose(_pixels(img), np.broadcast_to(COLOUR, (12, 16, 3)), atol=3 if lossy else 0)


def test_gif_gives_the_first_frame(tmp_path: Path) -> None:
    path = tmp_path / "anim.gif"
    red, blue = Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))
    red.save(path, save_all=True, append_images=[blue], duration=10)
    with Image.open(path) as img:
        assert img.n_frames == 2
    assert read_image(path).getpixel((4, 4)) == (255, 0, 0)


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    # Stored 20 wide x 10 high, left half red, right half blue; Orientation=6 means "rotate 90 degrees
    # clockwise to display", so the upright image is 10 x 20 with red on top and blue below.
    img = Image.new("RGB", (20, 10), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 10, 10))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "phone.jpg"
    img.save(path, exif=exif.tobytes(), quality=95)
    upright = read_image(path)
    assert upright.size == (10, 20)
    top, bottom = _pixels(upright)[3, 5], _pixels(upright)[16, 5]
    assert top[0] > 200 and top[2] < 50, top
    assert bottom[2] > 200 and bottom[0] < 50, bottom


def test_grey_L(tmp_path: Path) -> None:
    path = tmp_path / "grey.png"
    Image.new("L", (4, 4), 77).save(path)
    assert read_image(path).getpixel((0, 0)) == (77, 77, 77)


def test_palette_with_transparency_composites_on_white(tmp_path: Path) -> None:
    img = Image.new("P", (4, 2), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * (254 * 3))
    img.paste(1, (0, 0, 2, 2))  # left half: palette index 1 (red); right half: index 0 (transparent)
    path = tmp_path / "palette.png"
    img.save(path, transparency=0)
    rgb = read_image(path)
    assert rgb.getpixel((0, 0)) == (255, 0, 0)
    assert rgb.getpixel((3, 1)) == (255, 255, 255)


def test_cmyk(tmp_path: Path) -> None:
    img = Image.new("CMYK", (4, 2), (0, 0, 0, 0))
    img.paste((0, 255, 255, 0), (0, 0, 2, 2))
    path = tmp_path / "cmyk.tif"
    img.save(path)
    rgb = read_image(path)
    assert rgb.getpixel((0, 0)) == (255, 0, 0)
    assert rgb.getpixel((3, 0)) == (255, 255, 255)


def test_rgba_and_la_composite_on_white(tmp_path: Path) -> None:
    pixels = np.array([[[255, 0, 0, 0], [255, 0, 0, 255], [0, 0, 255, 128]]], np.uint8)
    path = tmp_path / "alpha.png"
    Image.fromarray(pixels).save(path)
    rgb = _pixels(read_image(path))
    assert tuple(rgb[0, 0]) == (255, 255, 255)  # fully transparent red shows the white background
    assert tuple(rgb[0, 1]) == (255, 0, 0)
    np.testing.assert_allclose(rgb[0, 2], (127, 127, 255), atol=1)
    la = Image.fromarray(np.array([[[10, 0], [10, 255]]], np.uint8), mode="LA")
    assert _pixels(rgb_from_image(la)).tolist() == [[[255, 255, 255], [10, 10, 10]]]


SIXTEEN_BIT = np.array([[0, 257, 32768, 65535]], np.uint16)
EIGHT_BIT = [0, 1, 128, 255]  # round(v * 255 / 65535): scaled, not clipped at 255


@pytest.mark.parametrize(("mode", "ext"), [("I;16", ".png"), ("I;16", ".tif"), ("I;16B", ".tif")])
def test_sixteen_bit_is_scaled_not_clipped(tmp_path: Path, mode: str, ext: str) -> None:
    raw = SIXTEEN_BIT.astype(">u2" if mode == "I;16B" else "<u2").tobytes()
    img = Image.frombytes(mode, (4, 1), raw)
    path = tmp_path / f"deep{ext}"
    img.save(path)
    with Image.open(path) as stored:
        assert stored.mode.startswith("I")
    assert _pixels(read_image(path))[0, :, 0].tolist() == EIGHT_BIT


def test_int32_I_mode() -> None:
    within = Image.fromarray(SIXTEEN_BIT.astype(np.int32))
    assert within.mode == "I"
    assert _pixels(rgb_from_image(within))[0, :, 0].tolist() == EIGHT_BIT
    outside = Image.fromarray(np.array([[-100, 99_900]], np.int32))
    assert _pixels(rgb_from_image(outside))[0, :, 0].tolist() == [0, 255]  # min-max stretched


def test_one_bit(tmp_path: Path) -> None:
    img = Image.new("1", (4, 1), 0)
    img.putpixel((1, 0), 1)
    path = tmp_path / "bits.bmp"
    img.save(path)
    assert _pixels(read_image(path))[0, :, 1].tolist() == [0, 255, 0, 0]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.0, 0.5, 1.0], [0, 128, 255]),  # [0, 1] -> x 255
        ([0.0, 127.6, 255.0], [0, 128, 255]),  # [0, 255] -> as is
        ([-1.0, 0.0, 1.0], [0, 128, 255]),  # anything else -> stretched
        ([float("nan"), 0.25, 1.0], [0, 64, 255]),  # NaN -> 0
    ],
)
def test_float_F(tmp_path: Path, values: list[float], expected: list[int]) -> None:
    path = tmp_path / "float.tif"
    Image.fromarray(np.array([values], np.float32)).save(path)
    with Image.open(path) as stored:
        assert stored.mode == "F"
    assert _pixels(read_image(path))[0, :, 2].tolist() == expected


def _jpeg(path: Path) -> bytes:
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path, quality=90)
    return path.read_bytes()


def test_truncated_jpeg_is_an_error(tmp_path: Path) -> None:
    data = _jpeg(tmp_path / "whole.jpg")
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(data[: len(data) // 2])
    check_image_header(cut)  # the header alone looks fine ...
    with pytest.raises(UnreadableFileError, match=r"cut\.jpg.*truncated"):
        read_image(cut)  # ... the full decode does not
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p.write_bytes(np.random.default_rng(1).bytes(300)), "identify"),
        (lambda p: p.write_bytes(b""), "identify"),
        (lambda p: p.mkdir(), "directory"),
        (lambda p: None, "no such file"),
    ],
    ids=["random-bytes", "zero-bytes", "directory", "missing"],
)
def test_bad_files_name_the_file_and_reason(tmp_path: Path, make, reason: str) -> None:
    path = tmp_path / "x.jpg"
    make(path)
    for reader in (read_image, check_image_header):
        with pytest.raises(DataError, match=reason) as info:
            reader(path)
        assert "x.jpg" in str(info.value)
