"""The CLI owns the terminal: rich consoles for results (stdout) and messages (stderr)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from trtopt.errors import TrtoptError

if TYPE_CHECKING:
    from trtopt.calib import CalibProgress

# Where output goes to a file or a pipe (a log, CI, `| less`), rich assumes 80 columns and cuts a wide table's
# figures to "0.99…": give it room instead, unless COLUMNS says how wide.
LOG_WIDTH = 200


def _width(stream: Any) -> int | None:
    """None (rich reads the terminal, or COLUMNS) on a terminal or where COLUMNS is set; else `LOG_WIDTH`."""
    isatty = getattr(stream, "isatty", None)
    return None if (isatty is not None and isatty()) or os.environ.get("COLUMNS") else LOG_WIDTH


out = Console(highlight=False, soft_wrap=False, markup=False, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, markup=False, width=_width(sys.stderr))


def print_error(exc: TrtoptError) -> None:
    """Error texts carry file names and hints such as `pip install 'trtopt[gpu]'`: never read as markup."""
    err.print(f"[bold red]error:[/] {escape(exc.what)}", markup=True, soft_wrap=True)
    if exc.fix:
        err.print(f"[bold]fix:[/] {escape(exc.fix)}", markup=True, soft_wrap=True)


def markup_safe(text: object) -> str:
    """User text (file names, tensor names, reasons) to put inside a markup string: `dog[red].jpg` stays."""
    return escape(str(text))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def progress(description: str = "", *, unit: str = "img", disable: bool = False) -> Progress:
    """A progress bar on stderr (so `--json` output on stdout stays clean)."""
    return Progress(
        TextColumn("[bold]{task.description}"),  # descriptions are trtopt's own phase names
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),  # for the search's trials, from their upper bound: it may end sooner
        console=err,
        disable=disable or not err.is_terminal,
        transient=False,
    )


@contextmanager
def phase_progress(label: str, *, disable: bool = False) -> Iterator[Callable[[CalibProgress], None]]:
    """A calibration progress callback: one bar per pass, with its images/s and the stage that bounds it
    (the one the pipeline waits on most: decode, inference or counting)."""
    if not disable and not err.is_terminal:  # a log file or CI: no bar, but a line per phase, not silence
        yield _phase_lines(label)
        return
    with progress(disable=disable) as bar:
        tasks: dict[str, Any] = {}

        def update(report: CalibProgress) -> None:
            if report.phase not in tasks:
                total, name = report.total_samples, _phase_name(report)
                tasks[report.phase] = bar.add_task(name if _is_stage(report) else f"{label}: {name}", total=total,
                                                   rate="")  # fmt: skip
            bound = f", bound by {report.bound}" if report.bound else ""
            rate = f"{report.images_per_s:.1f} img/s{bound}" if report.seconds > 0 and _counts_images(report) else ""
            bar.update(tasks[report.phase], completed=report.samples, total=report.total_samples, rate=rate)

        yield update


def _named_phases() -> dict[str, str]:
    """The phases that count something other than images (trials, tensors), by what the bar calls them."""
    from trtopt.calib.collect import AUTO_PHASE
    from trtopt.search import SENSITIVITY_PHASE

    return {SENSITIVITY_PHASE: "sensitivity analysis, trials", AUTO_PHASE: "auto thresholds, tensors scored"}


def _phase_name(report: CalibProgress) -> str:
    if _is_stage(report):
        return report.phase.removeprefix(_build_stage())
    return _named_phases().get(report.phase, f"{report.phase} pass")


def _counts_images(report: CalibProgress) -> bool:
    return report.phase not in _named_phases() and not _is_stage(report)


def _build_stage() -> str:
    from trtopt.calib.collect import BUILD_STAGE

    return BUILD_STAGE


def _is_stage(report: CalibProgress) -> bool:
    """A build stage's start or end (`trtopt.calib.collect.BUILD_STAGE`), not a pass that counts."""
    return report.phase.startswith(_build_stage())


# A phase's intermediate lines (each tenth done) start once it has run this long: a phase of a second or two
# then prints its start and its end only (the demo build's auto scoring, 1.6 s, printed 11 lines).
QUIET_SECONDS = 5.0


def _left(report: CalibProgress) -> str:
    """About how long the rest of a phase takes at its pace so far (the search's trials count to an upper
    bound: LEADER's 105 planned trials at 48 s each, docs/holdout.md round 9, said nothing of 80 minutes)."""
    if not report.samples or not report.total_samples or report.seconds <= 0:
        return ""
    from trtopt.search import SENSITIVITY_PHASE

    left = report.seconds * (report.total_samples - report.samples) / report.samples
    bound = "at most " if report.phase == SENSITIVITY_PHASE else ""
    return f", {bound}about {left / 60:.0f} min left" if left >= 90 else f", {bound}about {left:.0f}s left"


def _so_far(samples: int, total: int | None) -> str:
    """A phase's first line: "started (40 to do)", or "8 of 32 done" when its first report comes after a batch."""
    if not samples:
        return f"started ({total} to do)" if total else "started"
    return f"{samples} of {total} done" if total else f"{samples} done"


def _phase_lines(label: str) -> Callable[[CalibProgress], None]:
    """Progress for a stderr that is no terminal (redirected to a file, CI): a line when a phase starts, at
    each tenth of its known total once it has run `QUIET_SECONDS`, and when it is done, so a long build does
    not look hung and a short one does not fill the log."""
    tenths: dict[str, int] = {}

    def update(report: CalibProgress) -> None:
        if _is_stage(report):  # a stage after calibration: a line as it starts, and as it ends where it ran long
            if not report.samples:
                err.print(f"{_phase_name(report)} ...")
            elif report.seconds >= QUIET_SECONDS:
                err.print(f"{_phase_name(report)}: done in {report.seconds:.1f}s")
            return
        name, total = f"{label}: {_phase_name(report)}", report.total_samples
        if report.phase not in tenths:
            tenths[report.phase] = 0
            if not total or report.samples < total:  # else the line that says it is done follows at once
                err.print(f"{name}: {_so_far(report.samples, total)}")
        tenth = min(10, report.samples * 10 // total) if total else 0
        if tenth > tenths[report.phase] and (tenth == 10 or report.seconds >= QUIET_SECONDS):
            tenths[report.phase] = tenth
            done = "done" if tenth == 10 else f"of {total} done"
            took = f" {'in' if tenth == 10 else 'after'} {report.seconds:.1f}s" if report.seconds > 0 else ""
            err.print(f"{name}: {report.samples} {done}{took}{_left(report) if tenth < 10 else ''}")

    return update
