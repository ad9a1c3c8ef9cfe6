"""Render text-line images with Pillow and a DejaVu font: calibration and test data for OCR models.

OCR recognisers and text detectors see dark glyphs on light paper; `calib_data/`'s photographs are not
representative of that (issue #16 part 3). This renders reproducible lines of mixed words, digits and
punctuation with random size, ink, paper, slight rotation and noise, then writes them either as PNG files
or straight as model-ready arrays (`.npz`, one array named after the model's input).

    python tools/text_lines.py png OUT_DIR --count 64
    python tools/text_lines.py npz OUT.npz --kind ppocr-rec --count 64 --seed 1

Kinds (preprocessing as the shipping packages apply it):
- `ppocr-rec`: [N, 3, 48, 320], BGR, (x / 255 - 0.5) / 0.5, right-padded with 0 (rapidocr's text_recognize);
- `ppocr-cls`: [N, 3, 48, 192], same normalisation (rapidocr's text_cls);
- `ppocr-det`: [N, 3, 320, 320] pages of several lines, BGR, ImageNet mean/std (rapidocr's text_detect);
- `dddd-rec`:  [1, 1, 64, 160] grey / 255 (ddddocr's ocr_engine), one line per file (fixed batch 1);
- `dddd-det`:  [1, 3, 416, 416] BGR 0..255, letterboxed onto grey 114 (ddddocr's detection_engine).
"""

from __future__ import annotations

import argparse
import random
import string
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf", "DejaVuSansCondensed.ttf")
_WORD_LIST = (
    "invoice total amount date number order customer address street city account balance payment "
    "due quantity price tax report page section figure table chapter model layer output input value "
    "result the of and to in for with from by on at as an is be this that data text line image "
    "scale"
)
WORDS = _WORD_LIST.split()


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.random()
        if kind < 0.6:
            word = rng.choice(WORDS)
            parts.append(word.capitalize() if rng.random() < 0.3 else word.upper() if rng.random() < 0.1 else word)
        elif kind < 0.85:
            parts.append(str(rng.randint(0, 99999)))
        else:
            parts.append("".join(rng.choice(string.ascii_letters + string.digits) for _ in range(rng.randint(3, 8))))
    text = " ".join(parts)
    return text + rng.choice(["", "", ".", ",", ":", "%", " $12.50", "-7"])


def _font(rng: random.Random, size: int) -> ImageFont.FreeTypeFont:
    available = [FONT_DIR / f for f in FONTS if (FONT_DIR / f).is_file()]
    if not available:
        raise SystemExit(f"no DejaVu font in {FONT_DIR}: install fonts-dejavu-core")
    return ImageFont.truetype(str(rng.choice(available)), size)


def render_line(rng: random.Random, text: str | None = None) -> Image.Image:
    """One RGB text line, tightly cropped with a small margin, dark ink on light paper (or, rarely, inverted)."""
    text = text or random_text(rng)
    font = _font(rng, rng.randint(20, 40))
    left, top, right, bottom = font.getbbox(text)
    margin = rng.randint(2, 10)
    size = (right - left + 2 * margin, bottom - top + 2 * margin)
    paper = tuple(rng.randint(190, 255) for _ in range(3))
    ink = tuple(rng.randint(0, 80) for _ in range(3))
    if rng.random() < 0.1:
        paper, ink = ink, paper
    image = Image.new("RGB", size, paper)
    ImageDraw.Draw(image).text((margin - left, margin - top), text, font=font, fill=ink)
    if rng.random() < 0.5:
        image = image.rotate(rng.uniform(-2, 2), expand=False, fillcolor=paper, resample=Image.BILINEAR)
    if rng.random() < 0.3:
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.9)))
    noise = np.random.default_rng(rng.randint(0, 2**31)).normal(0, 4, (size[1], size[0], 3))
    pixels = np.asarray(image, dtype=np.float32) + noise
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def render_page(rng: random.Random, size: int) -> Image.Image:
    """A square page with a few lines placed at random (for text detectors)."""
    page = Image.new("RGB", (size, size), tuple(rng.randint(200, 255) for _ in range(3)))
    y = rng.randint(4, 20)
    while y < size - 24:
        line = render_line(rng)
        scale = min(1.0, (size - 8) / line.width) * rng.uniform(0.5, 1.0)
        line = line.resize((max(1, int(line.width * scale)), max(1, int(line.height * scale))), Image.BILINEAR)
        x = rng.randint(0, max(0, size - line.width))
        page.paste(line, (x, y))
        y += line.height + rng.randint(4, 30)
    return page


def _bgr(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float32)[:, :, ::-1]


def ppocr_line(image: Image.Image, height: int, width: int) -> np.ndarray:
    """rapidocr's resize_norm_img: keep the aspect ratio to `height`, at most `width`, pad right with 0."""
    ratio = image.width / image.height
    resized_w = min(width, int(np.ceil(height * ratio)))
    pixels = _bgr(image.resize((resized_w, height), Image.BILINEAR)) / 255.0
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :resized_w] = ((pixels - 0.5) / 0.5).transpose(2, 0, 1)
    return out


def ppocr_page(image: Image.Image) -> np.ndarray:
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    return ((_bgr(image) / 255.0 - mean) / std).astype(np.float32).transpose(2, 0, 1)


def dddd_line(image: Image.Image, width: int = 160) -> np.ndarray:
    grey = image.resize((width, 64), Image.BILINEAR).convert("L")
    return (np.asarray(grey, dtype=np.float32) / 255.0)[None]


def dddd_page(image: Image.Image, size: int = 416) -> np.ndarray:
    r = min(size / image.height, size / image.width)
    resized = _bgr(image.resize((int(image.width * r), int(image.height * r)), Image.BILINEAR))
    out = np.full((size, size, 3), 114.0, np.float32)
    out[: resized.shape[0], : resized.shape[1]] = resized
    return out.transpose(2, 0, 1)


def samples(kind: str, count: int, seed: int) -> np.ndarray:
    rng = random.Random(seed)
    if kind == "ppocr-rec":
        return np.stack([ppocr_line(render_line(rng), 48, 320) for _ in range(count)])
    if kind == "ppocr-cls":
        return np.stack([ppocr_line(_maybe_flipped(rng, render_line(rng)), 48, 192) for _ in range(count)])
    if kind == "ppocr-det":
        return np.stack([ppocr_page(render_page(rng, 320)) for _ in range(count)])
    if kind == "dddd-rec":
        return np.stack([dddd_line(render_line(rng)) for _ in range(count)])
    if kind == "dddd-det":
        return np.stack([dddd_page(render_page(rng, rng.choice((320, 416)))) for _ in range(count)])
    raise SystemExit(f"unknown kind {kind!r}")


def _maybe_flipped(rng: random.Random, image: Image.Image) -> Image.Image:
    """The orientation classifier tells upright lines from lines turned by 180 degrees: give it both."""
    return image.rotate(180) if rng.random() < 0.5 else image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("png", "npz"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--kind", default="ppocr-rec")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--input", default="x", help="array name in the .npz (the model's input name)")
    args = parser.parse_args()
    if args.mode == "png":
        args.out.mkdir(parents=True, exist_ok=True)
        rng = random.Random(args.seed)
        for i in range(args.count):
            render_line(rng).save(args.out / f"line_{i:04d}.png")
        return
    np.savez(args.out, **{args.input: samples(args.kind, args.count, args.seed)})


if __name__ == "__main__":
    main()
