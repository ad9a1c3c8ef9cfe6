"""Every shipped photo has its provenance row, and the calibration and held-out sets stay apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PHOTO_SETS = [ROOT / "calib_data", ROOT / "tests" / "data" / "heldout", ROOT / "tests" / "data" / "heldout_more"]
ROW = re.compile(r"^\| `([^`]+\.jpg)` \|(.*)$")


def _rows(folder: Path) -> dict[str, str]:
    rows = {}
    for line in (folder / "SOURCES.md").read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


@pytest.mark.parametrize("folder", PHOTO_SETS, ids=lambda p: p.name)
def test_sources_table_lists_exactly_the_photos(folder: Path) -> None:
    photos = {p.name for p in folder.glob("*.jpg")}
    rows = _rows(folder)
    assert photos and set(rows) == photos, sorted(set(rows) ^ photos)
    header = (folder / "SOURCES.md").read_text(encoding="utf-8")
    assert f"{len(photos)} photographs" in header
    for name, row in rows.items():
        assert not re.search(r"BY-SA|GPL|NC-|non-commercial", row, re.IGNORECASE), name


def test_sets_share_no_photo_or_original() -> None:
    seen: dict[str, str] = {}
    for folder in PHOTO_SETS:
        for name, row in _rows(folder).items():
            cells = [c.strip() for c in row.split("|")]
            # registry | package | version | path inside the package | licence | author | original source | ...
            keys = [name, " ".join(cells[1:4])]
            if cells[6].startswith("http"):
                keys.append(cells[6])
            for key in keys:
                assert key not in seen, f"{folder.name}/{name} repeats {seen.get(key)} ({key})"
                seen[key] = f"{folder.name}/{name}"
