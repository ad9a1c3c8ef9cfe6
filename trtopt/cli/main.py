"""`trtopt` entry point: parse arguments, dispatch to a subcommand, turn user errors into clean exits.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`, and imports its heavy
dependencies inside `run`, so `trtopt --help` and every `trtopt CMD --help` work without them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from trtopt._version import __version__
from trtopt.errors import TrtoptError

# name -> (module, one-line help); order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("trtopt.cli.inspect_cmd", "show a model's inputs, ops, size, MACs and what optimize does to it"),
    "optimize": ("trtopt.cli.optimize_cmd", "run the graph passes (BN folding, CBR, horizontal, concat)"),
    "sparsify": ("trtopt.cli.sparsify_cmd", "prune Conv/Gemm/MatMul weights to 2:4 sparsity and measure the cost"),
    "calibrate": ("trtopt.cli.calibrate_cmd", "compute INT8 thresholds from images and write a cache"),
    "build": ("trtopt.cli.build_cmd", "optimise, calibrate, quantise and build a plan file"),
    "run": ("trtopt.cli.run_cmd", "run a plan on images and print the top-5 labels"),
    "compare": ("trtopt.cli.compare_cmd", "compare a plan against the FP32 model, per output or per layer"),
    "bench": ("trtopt.cli.bench_cmd", "measure a plan's latency and throughput per batch size"),
    "export": ("trtopt.cli.export_cmd", "extract the raw engine or ONNX from a plan, or write a Triton repository"),
}

EPILOG = """\
typical use:
  trtopt inspect model.onnx
  trtopt build model.onnx --int8 --calib calib_data/ -o plan.engine
  trtopt run plan.engine images/
  trtopt compare model.onnx plan.engine --data images/

Run `trtopt COMMAND --help` for each command's options.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtopt",
        description="TensorRT graph optimizer and entropy INT8 calibrator: ONNX in, fast INT8 plan out.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trtopt {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(
            name,
            help=summary,
            description=(module.__doc__ or summary).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every `finally` and temporary-file cleanup runs."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def _signals_as_interrupts(*, leave_sigint_ignored: bool) -> Iterator[None]:
    """SIGTERM raises `Terminated` while a command runs. The real CLI (argv from the command line) then
    ignores a late Ctrl-C while the interpreter shuts down, where it could only print a traceback."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if leave_sigint_ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: Sequence[str] | None = None) -> int:
    with _signals_as_interrupts(leave_sigint_ignored=argv is None):
        try:
            return _main(argv)
        except KeyboardInterrupt as exc:
            return _interrupted(exc)


def _quiet_onnxruntime() -> None:
    """Errors only from ONNX Runtime's process-wide logger, below -vv. trtopt's sessions ask for that
    already, but graph optimisers log through the default logger: a 1024 x 1024 line segmenter
    (wired-table-rec's) printed ten `UnsqueezeElimination cannot remove node` warnings, in colour, per
    session it opened. Set here, not on import: a library caller's own logging stays theirs."""
    try:
        import onnxruntime
    except ImportError:  # a broken install: the command that needs it says so; nothing to quieten
        return
    onnxruntime.set_default_logger_severity(3)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    if args.verbose < 2:
        _quiet_onnxruntime()
    from trtopt.cli.console import err, print_error
    from trtopt.cli.outputs import check_cli_outputs
    from trtopt.frontend.writer import forget_written

    forget_written()
    try:
        check_cli_outputs(args.command, args)
        return int(args._run(args) or 0)
    except TrtoptError as exc:
        print_error(exc)
        if _written_note():
            err.print(f"note:{_written_note()}", soft_wrap=True)
        return exc.exit_code
    except MemoryError:
        print_error(
            TrtoptError(
                f"`trtopt {args.command}` ran out of memory;{_written_note() or ' nothing was written.'}",
                fix="Use smaller batches (--batch / --calib-batch), fewer or smaller inputs, or a machine with "
                "more memory.",
            )
        )
        return 2


def _interrupted(exc: KeyboardInterrupt) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not turn this into a traceback
    try:
        from trtopt.cli.console import print_error

        what = "Terminated (SIGTERM)" if isinstance(exc, Terminated) else "Interrupted"
        note = _written_note()
        print_error(TrtoptError(f"{what};{note or ' nothing was written.'}"))
    finally:
        if not isinstance(exc, Terminated):
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return 143 if isinstance(exc, Terminated) else 130


def _written_note() -> str:
    from trtopt.frontend.writer import written_paths

    paths = written_paths()
    if not paths:
        return ""
    return f" already written, complete: {', '.join(repr(str(p)) for p in paths)}; nothing else was written."


if __name__ == "__main__":
    sys.exit(main())
