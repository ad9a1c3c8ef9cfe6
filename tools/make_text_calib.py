#!/usr/bin/env python3
"""Render the text-image calibration set in calib_text/: text lines for OCR recognisers and angle
classifiers (calib_text/lines/), document pages for text detectors, layout, orientation and table models
(calib_text/pages/). Deterministic for a seed; the output is committed, so this runs only to remake it.

    python tools/make_text_calib.py [--out calib_text] [--lines 96] [--pages 32] [--seed 0]

Fonts: the DejaVu fonts that matplotlib ships (mpl-data/fonts/ttf, Bitstream Vera licence with DejaVu's
public-domain changes: free to use, embed and redistribute; LICENSE_DEJAVU beside them). Text: the word
list below and random codes, numbers and dates, written for this project. See calib_text/SOURCES.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

ROOT = Path(__file__).resolve().parents[1]
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSerif.ttf",
              "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf")
_TEXT = """the model runs on every image in the folder and writes its results to a table of numbers
calibration needs a few hundred samples that look like what the service will see in production
please check the invoice total before the end of the month and send the signed copy back to us
order shipped from the north warehouse on monday with tracking details attached below
the meeting moved to room twelve on the second floor after lunch
temperature pressure and humidity were recorded every ten minutes during the test
page section chapter figure table appendix summary results method discussion
account balance payment due amount received reference customer number date
street avenue road city postal code country phone email address contact
quantity unit price discount tax subtotal total description item product service
open close start stop next previous save print export import settings help
morning evening weekend holiday schedule train station platform ticket seat
"""
WORDS = _TEXT.split()
CAPTCHA_CHARS = "abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def load_font(rng: np.random.Generator, size: int, fonts: list[Path]) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), size)


def sentence(rng: np.random.Generator, low: int = 3, high: int = 9) -> str:
    words = [str(WORDS[int(i)]) for i in rng.integers(0, len(WORDS), int(rng.integers(low, high + 1)))]
    text = " ".join(words)
    return text[0].upper() + text[1:] + str(rng.choice([".", "", ",", ":", "!"]))


def code(rng: np.random.Generator) -> str:
    kind = int(rng.integers(6))
    if kind == 0:
        return f"INV-{rng.integers(10000, 99999)}/{rng.integers(10, 99)}"
    if kind == 1:
        return f"{rng.integers(1, 28):02d}.{rng.integers(1, 12):02d}.{rng.integers(1990, 2030)}"
    if kind == 2:
        return f"Total: {rng.integers(1, 9999)}.{rng.integers(0, 99):02d} EUR"
    if kind == 3:
        return f"Tel +{rng.integers(10, 99)} {rng.integers(100, 999)} {rng.integers(1000, 9999)}"
    if kind == 4:
        return f"{rng.integers(0, 23):02d}:{rng.integers(0, 59):02d} Platform {rng.integers(1, 20)}"
    return "".join(str(rng.choice(list("ABCDEFGHKLMNPRSTXYZ0123456789"))) for _ in range(int(rng.integers(5, 10))))


def colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(background, ink): mostly dark ink on light paper, sometimes light on dark."""
    paper = tuple(int(v) for v in rng.integers(205, 256, 3))
    ink = tuple(int(v) for v in rng.integers(0, 90, 3))
    return (ink, paper) if rng.random() < 0.12 else (paper, ink)


def text_line(rng: np.random.Generator, fonts: list[Path]) -> Image.Image:
    """One cropped line of text, as a text detector's crop would be."""
    captcha = rng.random() < 0.15
    text = "".join(rng.choice(list(CAPTCHA_CHARS), int(rng.integers(4, 7)))) if captcha else (
        code(rng) if rng.random() < 0.35 else sentence(rng, 2, 7))
    font = load_font(rng, int(rng.integers(20, 46)), fonts)
    left, top, right, bottom = font.getbbox(text)
    pad_x, pad_y = int(rng.integers(4, 18)), int(rng.integers(3, 12))
    size = (right - left + 2 * pad_x, bottom - top + 2 * pad_y)
    paper, ink = colours(rng)
    img = Image.new("RGB", size, paper)
    draw = ImageDraw.Draw(img)
    if captcha:  # ddddocr-style: noisy background strokes
        for _ in range(int(rng.integers(2, 6))):
            xy = [(int(rng.integers(size[0])), int(rng.integers(size[1]))) for _ in range(2)]
            draw.line(xy, fill=tuple(int(v) for v in rng.integers(60, 200, 3)), width=int(rng.integers(1, 3)))
    draw.text((pad_x - left, pad_y - top), text, font=font, fill=ink)
    return finish(img, rng, angle=float(np.clip(rng.normal(0, 0.3), -0.5, 0.5)) * min(1.0, 300 / size[0]))


def finish(img: Image.Image, rng: np.random.Generator, angle: float = 0.0) -> Image.Image:
    """Small rotation, blur and sensor noise, as scans and photos of text have."""
    if abs(angle) > 0.2:
        fill = img.getpixel((0, 0))
        img = img.rotate(angle, resample=Image.Resampling.BICUBIC, expand=False, fillcolor=fill)
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 0.9))))
    pixels = np.asarray(img, np.float32) + rng.normal(0, float(rng.uniform(1, 6)), (img.height, img.width, 1))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def page(rng: np.random.Generator, fonts: list[Path], size: tuple[int, int] = (608, 800)) -> Image.Image:
    """A document page: header, title, paragraphs, maybe a table (ruled or not) or a chart, footer."""
    paper, ink = tuple(int(v) for v in rng.integers(225, 256, 3)), (20, 20, 30)
    img = Image.new("RGB", size, paper)
    draw = ImageDraw.Draw(img)
    margin, y = int(rng.integers(30, 60)), int(rng.integers(20, 40))
    small = load_font(rng, 12, fonts)
    draw.text((margin, y), sentence(rng, 2, 4).upper()[:40], font=small, fill=(90, 90, 90))
    y += 34
    title = ImageFont.truetype(str(fonts[1]), int(rng.integers(22, 32)))
    draw.text((margin, y), sentence(rng, 2, 5)[:34], font=title, fill=ink)
    y += 50
    body = load_font(rng, int(rng.integers(13, 18)), fonts)
    while y < size[1] - 120:
        kind = rng.random()
        if kind < 0.2:
            y = table(draw, rng, body, margin, y, size[0] - 2 * margin, ruled=rng.random() < 0.6) + 18
        elif kind < 0.32:
            y = chart(draw, rng, small, margin, y, size[0] - 2 * margin) + 18
        else:
            y = paragraph(draw, rng, body, margin, y, size[0] - 2 * margin, ink) + 14
    draw.text((size[0] // 2 - 10, size[1] - 34), str(int(rng.integers(1, 300))), font=small, fill=(90, 90, 90))
    return finish(img, rng, angle=float(rng.normal(0, 0.6)))


def paragraph(draw: ImageDraw.ImageDraw, rng: np.random.Generator, font: ImageFont.FreeTypeFont, x: int, y: int,
              width: int, ink: tuple[int, ...]) -> int:
    line_height = int(font.size * 1.45)
    for _ in range(int(rng.integers(2, 7))):
        words, line = " ".join(sentence(rng) for _ in range(3)).split(), ""
        for word in words:
            if font.getlength(line + " " + word) > width:
                break
            line = (line + " " + word).strip()
        draw.text((x, y), line, font=font, fill=ink)
        y += line_height
    return y


def table(draw: ImageDraw.ImageDraw, rng: np.random.Generator, font: ImageFont.FreeTypeFont, x: int, y: int,
          width: int, ruled: bool) -> int:
    rows, cols = int(rng.integers(3, 7)), int(rng.integers(2, 5))
    row_h, col_w = int(font.size * 1.8), width // cols
    for r in range(rows):
        for c in range(cols):
            text = str(WORDS[int(rng.integers(len(WORDS)))]) if c == 0 else f"{rng.uniform(0, 999):.2f}"
            draw.text((x + c * col_w + 6, y + r * row_h + 5), text.title() if r == 0 else text, font=font,
                      fill=(20, 20, 30))
    if ruled:
        for r in range(rows + 1):
            draw.line([(x, y + r * row_h), (x + cols * col_w, y + r * row_h)], fill=(40, 40, 40), width=1)
        for c in range(cols + 1):
            draw.line([(x + c * col_w, y), (x + c * col_w, y + rows * row_h)], fill=(40, 40, 40), width=1)
    return y + rows * row_h


def chart(draw: ImageDraw.ImageDraw, rng: np.random.Generator, font: ImageFont.FreeTypeFont, x: int, y: int,
          width: int) -> int:
    height, bars = int(rng.integers(90, 160)), int(rng.integers(4, 10))
    draw.rectangle([x, y, x + width // 2, y + height], outline=(60, 60, 60))
    colour = tuple(int(v) for v in rng.integers(40, 200, 3))
    step = (width // 2) / bars
    for i in range(bars):
        top = y + height - int(rng.uniform(0.1, 0.95) * height)
        draw.rectangle([x + int(i * step) + 4, top, x + int((i + 1) * step) - 4, y + height], fill=colour)
    draw.text((x, y + height + 6), "Figure " + str(int(rng.integers(1, 9))) + ": " + sentence(rng, 2, 4), font=font,
              fill=(40, 40, 40))
    return y + height + 24


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "calib_text")
    parser.add_argument("--lines", type=int, default=96)
    parser.add_argument("--pages", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    fonts = [font_dir() / name for name in FONT_FILES]
    rng = np.random.default_rng(args.seed)
    (args.out / "lines").mkdir(parents=True, exist_ok=True)
    (args.out / "pages").mkdir(parents=True, exist_ok=True)
    for i in range(args.lines):
        text_line(rng, fonts).save(args.out / "lines" / f"line_{i:03d}.jpg", quality=90, optimize=True)
    for i in range(args.pages):
        img = page(rng, fonts)
        turn = (0, 0, 0, 90, 180, 270)[i % 6] if i % 4 == 3 else 0  # a few pages scanned the wrong way round
        img = img.rotate(turn, expand=True) if turn else img
        img.save(args.out / "pages" / f"page_{i:02d}.jpg", quality=70, optimize=True)
    total = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"{args.lines} lines and {args.pages} pages in {args.out} ({total / 1e6:.2f} MB)", file=sys.stderr)
    return 0 if math.isfinite(total) else 1


if __name__ == "__main__":
    sys.exit(main())
