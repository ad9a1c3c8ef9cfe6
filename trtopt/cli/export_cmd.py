"""Extract what a plan carries: the raw TensorRT engine (for trtexec or the C++ runtime) or the ONNX model
inside it, print the plan's header, or write the plan as a model of a Triton Inference Server repository.

examples:
  trtopt export plan.engine -o model.plan                 # raw engine (TensorRT plans)
  trtopt export plan.engine --section onnx -o model.onnx  # the quantised ONNX
  trtopt export plan.engine --info                        # what the plan is, as JSON
  trtopt export plan.engine --triton models/ --name resnet --instances 2     # a Triton model repository

--triton writes REPO/NAME/config.pbtxt and REPO/NAME/1/: model.plan (TensorRT plans, platform
tensorrt_plan, instances on every GPU), model.onnx (CPU plans with --triton-backend onnxruntime) or
model.py + plan.engine (--triton-backend python, the default for CPU plans: trtopt.Engine runs the plan in
the server and accepts encoded images as well as tensors). docs/serving.md has the details.
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
    t = parser.add_argument_group("Triton Inference Server model repository")
    t.add_argument("--triton", metavar="REPO", help="write the plan as a model in this repository folder")
    t.add_argument("--name", help="model name, the folder REPO/NAME (default: the plan file's name without suffix)")
    t.add_argument(
        "--triton-backend",
        choices=("tensorrt", "onnxruntime", "python"),
        default=None,
        help="Triton backend that serves it (default: tensorrt for TensorRT plans, python for CPU plans)",
    )
    t.add_argument(
        "--max-batch", type=int, default=None,
        help="max_batch_size (default: the engine's profile limit for TensorRT plans, 8 for CPU plans; 0 where the "
        "plan has no dynamic batch dimension)",
    )  # fmt: skip
    t.add_argument("--instances", type=int, default=1, help="model instances per GPU, or on the CPU (default: 1)")
    t.add_argument(
        "--dynamic-batching", choices=("on", "off"), default=None,
        help="let Triton group requests into batches (default: on where the plan batches)",
    )  # fmt: skip
    t.add_argument(
        "--queue-delay-us",
        type=int,
        default=None,
        help="dynamic batching: how long a request may wait for others (max_queue_delay_microseconds)",
    )
    t.add_argument("--preferred-batch", default=None, help="dynamic batching: preferred batch sizes, e.g. 4,8")
    t.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU plans: intra-op threads per instance (default: the CPUs shared by the instances)",
    )
    t.add_argument("--python-env", default=None,
                   help="python backend: EXECUTION_ENV_PATH, a Python environment with trtopt installed (a folder "
                   "with bin/activate, or a conda-pack tarball)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from trtopt.cli.console import err, print_json
    from trtopt.errors import PlanError, TrtoptError
    from trtopt.frontend import write_atomic
    from trtopt.plan import read_plan

    if args.triton:
        return _export_triton(args)
    _refuse_triton_options(args)
    plan = read_plan(args.plan)
    if args.info:
        print_json(plan.header())
        return 0
    if not args.output:
        raise TrtoptError("Nothing to do: give -o FILE to extract a section, --triton REPO, or --info.")
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


TRITON_ONLY = ("name", "triton_backend", "max_batch", "dynamic_batching", "queue_delay_us", "preferred_batch",
               "threads", "python_env")  # fmt: skip


def _refuse_triton_options(args: argparse.Namespace) -> None:
    from trtopt.errors import TrtoptError

    given = [f"--{n.replace('_', '-')}" for n in TRITON_ONLY if getattr(args, n) is not None]
    if args.instances != 1:
        given.append("--instances")
    if given:
        raise TrtoptError(f"{', '.join(given)} configure a Triton export.", fix="Add --triton REPO, or drop them.")


def _export_triton(args: argparse.Namespace) -> int:
    from trtopt.cli.console import err, out
    from trtopt.errors import TrtoptError
    from trtopt.serving.triton import TritonOptions, export_triton

    if args.output or args.section or args.info:
        raise TrtoptError("--triton writes a model repository; -o, --section and --info do something else.",
                          fix="Run them as separate commands.")  # fmt: skip
    if args.instances < 1:
        raise TrtoptError(f"--instances must be at least 1, got {args.instances}.", fix="Pass e.g. --instances 2.")
    options = TritonOptions(
        name=args.name,
        backend=args.triton_backend,
        max_batch=args.max_batch,
        instances=args.instances,
        dynamic_batching=None if args.dynamic_batching is None else args.dynamic_batching == "on",
        queue_delay_us=args.queue_delay_us,
        preferred_batch=_sizes(args.preferred_batch),
        threads=args.threads,
        python_env=args.python_env,
    )
    report = export_triton(args.plan, args.triton, options)
    batching = "dynamic batching" if report.dynamic_batching else "no dynamic batching"
    out.print(
        f"wrote Triton model {report.name!r} ({report.backend} backend, max_batch_size {report.max_batch_size}, "
        f"{batching}, {report.instances} instance(s)) to {report.path}/: {', '.join(report.files)}"
    )
    for note in report.notes:
        err.print(f"note: {note}", soft_wrap=True)
    return 0


def _sizes(text: str | None) -> tuple[int, ...]:
    from trtopt.errors import TrtoptError

    if text is None:
        return ()
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes:
        raise TrtoptError(f"--preferred-batch takes batch sizes like 4,8; got {text!r}.")
    return sizes
