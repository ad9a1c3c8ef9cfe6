#!/usr/bin/env python3
"""`--method auto`'s scoring as it ran before and as it runs now, side by side in one process.

    python tools/bench_auto_groups.py holdout:lore-detect [--out FILE.md]     # a cached zoo / hold-out model
    python tools/bench_auto_groups.py MODEL.onnx [--out FILE.md] [trtopt calibrate flags: --calib DIR --shapes ...]

Before: every cache group ran the whole graph, and groups held 1 GiB of tensors. Now: each group runs the graph
cut to the nodes its tensors depend on (`trtopt.calib.auto_cache.prefix_model`), and groups hold a quarter of
the free memory, 1 to 4 GiB (`scoring_budget`). Both run `trtopt calibrate` in this process, in turns (before,
now), and the table gives each one's wall time, its scoring's time (from the progress lines) and whether the
two wrote the same thresholds and methods (they must: the groups change the time, never the values).
`zoo:NAME` / `holdout:NAME` take the model from the zoo's cache (tools/zoo.py, tools/bench_holdout.py fetch)
with its catalog's data, preprocessing and static shape; the section says "skipped" when it is not cached.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_setup import emit, header_lines, load_average  # noqa: E402

SCORED = re.compile(r"tensors scored: (\d+) done in ([\d.]+)s")


def calibrate(model: str, flags: list[str], out: Path, before: bool) -> tuple[float, float | None, dict]:
    """Wall seconds, the scoring's seconds and the cache of one `trtopt calibrate` run, as before or now."""
    import trtopt.calib.auto as auto
    from trtopt.calib.auto_cache import BUDGET, prefix_model, scoring_budget
    from trtopt.cli.main import main

    auto.prefix_model = (lambda model, names: None) if before else prefix_model  # type: ignore[assignment]
    auto.scoring_budget = (lambda: BUDGET) if before else scoring_budget  # type: ignore[assignment]
    log = io.StringIO()
    start = time.perf_counter()
    with redirect_stderr(log), redirect_stdout(log):
        code = main(["calibrate", model, "-o", str(out), *flags])
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"trtopt calibrate failed ({code}):\n{log.getvalue()[-2000:]}")
    found = SCORED.search(log.getvalue())
    return wall, float(found.group(2)) if found else None, json.loads(out.read_text())


def cached_model(name: str) -> tuple[str, list[str]] | None:
    """The cached .onnx of `zoo:NAME` / `holdout:NAME` and the calibrate flags its catalog entry implies, or
    None when it is not cached."""
    import bench_holdout
    import zoo

    kind, _, short = name.partition(":")
    models = bench_holdout.HOLDOUT if kind == "holdout" else zoo.catalog()
    model = next((m for m in models if m.name == short), None)
    if model is None:
        raise SystemExit(f"{name}: no such model (names: {', '.join(m.name for m in models)})")
    path = bench_holdout.cached(model) if kind == "holdout" else zoo.cached_path(short)
    if path is None:
        return None
    return str(path), ["--calib", str(zoo.calib_path(model)), *model.preprocess, *model.shapes_flag]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="an .onnx file, or zoo:NAME / holdout:NAME from the zoo's cache")
    parser.add_argument("--out", type=Path)
    args, flags = parser.parse_known_args(argv)
    flags = [f for f in flags if f != "--"]
    title = ["## auto's scoring: cut graphs and memory-sized groups", "",
             *header_lines("tools/bench_auto_groups.py", argv)]  # fmt: skip
    model = args.model
    if ":" in model and not Path(model).exists():
        found = cached_model(model)
        if found is None:
            emit("\n".join([*title, "", f"Skipped: {model} is not in the cache (`python tools/bench_holdout.py "
                                       "fetch`, `python tools/zoo.py fetch`).", ""]), args.out)  # fmt: skip
            return 0
        model, flags = found[0], [*found[1], *flags]
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {label: calibrate(model, flags, Path(tmp, f"{label}.json"), label == "before")
                for label in ("before", "now")}  # fmt: skip
    same = all(rows["before"][2][key] == rows["now"][2][key] for key in ("thresholds", "methods"))
    lines = [
        *title,
        f"- model: `{model}`, `trtopt calibrate` flags: `{' '.join(flags)}`",
        f"- 1-minute load average {load} before, {load_average()} after (more than ~2 on 2 cores: noisy)",
        "",
        "| run | wall s | scoring s |",
        "|---|---:|---:|",
        *(f"| {label} | {wall:.1f} | {'-' if scored is None else f'{scored:.1f}'} |"
          for label, (wall, scored, _) in rows.items()),  # fmt: skip
        "",
        f"Same thresholds and methods: {'yes' if same else '**no**'}.",
        "",
    ]
    emit("\n".join(lines), args.out)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
