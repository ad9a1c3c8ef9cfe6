"""Extract what a plan carries: the raw TensorRT engine (for trtexec, Triton or the C++ runtime) or the
ONNX model inside it, or print the plan's header.

examples:
  trtopt export plan.engine -o model.plan                 # raw engine (TensorRT plans)
  trtopt export plan.engine --section onnx -o model.onnx  # the quantised ONNX
  trtopt export plan.engine --info                        # what the plan is, as JSON
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan file written by `trtopt build`")
    parser.add_argument("-o", "--output", help="where to write the extracted bytes")
    parser.add_argument(
        "--section", default=None, help="which section: 'engine' (default for TensorRT plans) or 'onnx'"
    )
    parser.add_argument("--info", action="store_true", help="print the plan header (JSON) instead")


def run(args: argparse.Namespace) -> int:
    from trtopt.cli.console import err, print_json
    from trtopt.errors import PlanError, TrtoptError
    from trtopt.frontend import write_atomic
    from trtopt.plan import read_plan

    plan = read_plan(args.plan)
    if args.info:
        print_json(plan.header())
        return 0
    if not args.output:
        raise TrtoptError("Nothing to do: give -o FILE to extract a section, or --info.")
    section = args.section or ("engine" if "engine" in plan.sections else "onnx")
    if section not in plan.sections:
        hint = (
            " A CPU plan carries no TensorRT engine; build with --backend tensorrt on a GPU machine."
            if section == "engine"
            else ""
        )
        raise PlanError(
            f"Plan {args.plan!r} ({plan.backend}) has no {section!r} section.{hint}",
            fix=f"Sections in this plan: {', '.join(plan.sections)}.",
        )
    write_atomic(args.output, plan.sections[section])
    err.print(f"wrote {section} ({len(plan.sections[section]):,} bytes) to {args.output}")
    return 0
