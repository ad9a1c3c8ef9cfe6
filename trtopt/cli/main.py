"""`trtopt` entry point: parse arguments, dispatch to a subcommand, turn user errors into clean exits.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`, and imports its heavy
dependencies inside `run`, so `trtopt --help` and every `trtopt CMD --help` work without them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from trtopt import __version__
from trtopt.errors import TrtoptError

# name -> (module, one-line help); order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("trtopt.cli.inspect_cmd", "show a model's inputs, ops, size, MACs and fusion opportunities"),
    "optimize": ("trtopt.cli.optimize_cmd", "run the graph passes (BN folding, CBR, horizontal, concat)"),
    "calibrate": ("trtopt.cli.calibrate_cmd", "compute INT8 thresholds from images and write a cache"),
    "build": ("trtopt.cli.build_cmd", "optimise, calibrate, quantise and build a plan file"),
    "run": ("trtopt.cli.run_cmd", "run a plan on images and print the top-5 labels"),
    "compare": ("trtopt.cli.compare_cmd", "compare a plan against the FP32 model, per output or per layer"),
    "bench": ("trtopt.cli.bench_cmd", "measure a plan's latency and throughput per batch size"),
    "export": ("trtopt.cli.export_cmd", "extract the raw engine or ONNX from a plan"),
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    from trtopt.cli.console import print_error

    try:
        return int(args._run(args) or 0)
    except TrtoptError as exc:
        print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print_error(TrtoptError("Interrupted; nothing was written."))
        return 130


if __name__ == "__main__":
    sys.exit(main())
