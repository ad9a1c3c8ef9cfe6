#!/usr/bin/env python3
"""`--method auto`'s scoring as it ran before and as it runs now, side by side in one process.

    python tools/bench_auto_groups.py MODEL.onnx [--out FILE.md] -- [trtopt calibrate flags: --calib ... --shapes ...]

Before: every cache group ran the whole graph, and groups held 1 GiB of tensors. Now: each group runs the graph
cut to the nodes its tensors depend on (`trtopt.calib.auto_cache.prefix_model`), and groups hold a quarter of
the free memory, 1 to 4 GiB (`scoring_budget`). Both run `trtopt calibrate` in this process, in turns (before,
now), and the table gives each one's wall time, its scoring's time (from the progress lines) and whether the
two wrote the same thresholds and methods (they must: the groups change the time, never the values).
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


def main(argv: list[str]) -> int:
    ours, flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(ours)
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {label: calibrate(args.model, flags, Path(tmp, f"{label}.json"), label == "before")
                for label in ("before", "now")}  # fmt: skip
    same = all(rows["before"][2][key] == rows["now"][2][key] for key in ("thresholds", "methods"))
    lines = [
        "## auto's scoring: cut graphs and memory-sized groups",
        "",
        *header_lines("tools/bench_auto_groups.py", argv),
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
