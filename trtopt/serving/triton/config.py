"""What a plan becomes in Triton's model configuration (`config.pbtxt`), and the checks on it.

Facts from Triton's model configuration guide
(https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_configuration.md):

- a model names its *platform* (`tensorrt_plan`, `onnxruntime_onnx`) or *backend* (`python`), its
  `max_batch_size` and its inputs and outputs with `data_type` and `dims`;
- with `max_batch_size` > 0 the batch dimension is left out of `dims` (the full shape is [-1] + dims), and
  every input and output must then have the batch as its first dimension; with 0, `dims` is the full shape;
  a dimension of -1 is variable; a shape must have rank >= 1;
- `dynamic_batching` (with `preferred_batch_size`, `max_queue_delay_microseconds`: the batcher guide,
  docs/user_guide/batcher.md) needs `max_batch_size` > 0;
- `instance_group { kind: KIND_GPU count: K }` puts K instances on every GPU, `KIND_CPU` K on the CPU;
- `label_filename` on an output lets clients ask for the top classes with their labels (the
  classification extension, docs/protocol/extension_classification.md);
- data types map from numpy as TYPE_FP32 <- float32 and so on (its "Datatypes" table); TensorRT has no
  64-bit floats nor unsigned types other than uint8.

Which Triton models a plan can become, the default one and the instance kind are its backend's
(`Backend.triton`, a `TritonServing`); so are the file each of them loads, the types it takes and whether
the plan takes only its recorded profiles' shapes (`Backend.profiled`). This module names no backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trtopt.backend import BACKENDS, Backend, TritonModel, get_backend
from trtopt.errors import TrtoptError, UnknownNameError
from trtopt.plan import Plan, TensorSpec
from trtopt.serving.triton.pbtxt import Enum

DTYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64", "bfloat16": "TYPE_BF16",
}  # fmt: skip
# Every plan can be served by Triton's Python backend through trtopt.serving.triton.python_model, which takes any
# type and reads its intra-op threads from the parameter "threads".
PYTHON_MODEL = TritonModel(
    name="python", key="backend", value="python", file="model.py", section=None, dtypes=frozenset(DTYPES),
    threads_parameter="threads",
)  # fmt: skip
REPEATED = frozenset({"input", "output", "dims", "instance_group", "preferred_batch_size", "parameters", "gpus"})
DEFAULT_CPU_MAX_BATCH = 8  # CPU plans take any batch; per image, batch 8 costs what batch 1 does (BENCHMARKS latency)
IMAGE_INPUT = "IMAGE"  # the Python model's input of encoded images (TYPE_STRING, one image per batch row)
LABELS_FILE = "labels.txt"
_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
MAX_THREADS = 1024


@dataclass(frozen=True)
class TritonOptions:
    """How to export. None means: decided from the plan (see `model_config`)."""

    name: str | None = None  # the model's name in the repository (default: the plan file's stem)
    backend: str | None = None  # the Triton backend: tensorrt | onnxruntime | python (default: the plan backend's)
    max_batch: int | None = None  # TensorRT: the engine's profile limit; CPU: DEFAULT_CPU_MAX_BATCH
    instances: int = 1  # per GPU (KIND_GPU) or on the CPU (KIND_CPU)
    dynamic_batching: bool | None = None  # None: on where the plan batches
    queue_delay_us: int | None = None  # max_queue_delay_microseconds
    preferred_batch: tuple[int, ...] = ()
    threads: int | None = None  # intra-op threads per CPU instance (default: the CPUs shared by the instances)
    python_env: str | None = None  # Python backend: EXECUTION_ENV_PATH, an environment with trtopt installed

    def __post_init__(self) -> None:
        """Numbers Triton cannot load are refused here, not in Triton: its config fields are 32-bit
        (max_batch_size, count, preferred_batch_size; model_config.proto) and the queue delay is unsigned 64-bit."""
        from trtopt.config_checks import check_int

        check_int(self.max_batch, "--max-batch", 0, INT32_MAX, example="8")
        check_int(self.instances, "--instances", 1, INT32_MAX, optional=False, example="2")
        check_int(self.queue_delay_us, "--queue-delay-us", 0, UINT64_MAX, example="100")
        check_int(self.threads, "--threads", 1, MAX_THREADS, example="4")
        for size in self.preferred_batch:
            check_int(size, "--preferred-batch", 1, INT32_MAX, optional=False, example="4")


def export_error(what: str, fix: str) -> TrtoptError:
    return TrtoptError(what, fix=fix)


def triton_models() -> dict[str, TritonModel]:
    """Every Triton model a plan of some backend can become, by its Triton backend's name."""
    models = {m.name: m for name in BACKENDS for m in BACKENDS.get(name).triton.models}
    return {**models, PYTHON_MODEL.name: PYTHON_MODEL}


def triton_model(name: str) -> TritonModel:
    models = triton_models()
    if name not in models:
        raise UnknownNameError("Triton backend", name, list(models))
    return models[name]


def plan_models(plan: Plan) -> dict[str, TritonModel]:
    """The Triton models this plan can become: its backend's, then the Python model."""
    return {**{m.name: m for m in _backend(plan).triton.models}, PYTHON_MODEL.name: PYTHON_MODEL}


def default_model(plan: Plan) -> str:
    return _backend(plan).triton.default


def check_plan_model(plan: Plan, name: str) -> TritonModel:
    """The Triton model `name` (--triton-backend), if it can serve this plan."""
    model = triton_model(name)
    choices = plan_models(plan)
    if name not in choices:
        owners = [b for b in map(BACKENDS.get, BACKENDS) if model in b.triton.models]
        title = _backend(plan).title
        raise export_error(
            f"Triton's {name} backend serves only {' and '.join(b.name for b in owners)} plans (it loads their "
            f"{model.section!r} section); this is a {plan.backend} plan.",
            f"Use --triton-backend {' or '.join(choices)} for {title} plans"
            + "".join(f", or build with --backend {b.name}" for b in owners) + ".",
        )
    return model


def _backend(plan: Plan) -> Backend[Any]:
    return get_backend(plan.backend)


def model_config(plan: Plan, options: TritonOptions, name: str, model: TritonModel) -> dict[str, Any]:
    """The configuration (as dicts for `pbtxt_from_dict`) that serves `plan` as `model`."""
    max_batch = max_batch_size(plan, options)
    batching = _dynamic_batching(options, max_batch)
    config: dict[str, Any] = {"name": name, model.key: model.value, "max_batch_size": max_batch}
    image = model == PYTHON_MODEL and _takes_images(plan)
    inputs = [_tensor(t, plan, max_batch, model, optional=image) for t in plan.inputs]
    if image:
        rows = 1 if max_batch else plan.inputs[0].shape[0]
        inputs.append({"name": image_input_name(plan), "data_type": Enum("TYPE_STRING"), "dims": [rows],
                       "optional": True})  # fmt: skip
    config["input"] = inputs
    config["output"] = [_tensor(t, plan, max_batch, model) for t in plan.outputs]
    labelled = labelled_output(plan)
    if labelled is not None:
        config["output"][labelled]["label_filename"] = LABELS_FILE
    if batching is not None:
        config["dynamic_batching"] = batching
    kind = Enum(_backend(plan).triton.instance_kind)
    config["instance_group"] = [{"count": options.instances, "kind": kind}]
    parameters = _parameters(options, model)
    if parameters:
        config["parameters"] = parameters
    return config


def max_batch_size(plan: Plan, options: TritonOptions) -> int:
    """0 where the plan cannot batch along a leading dimension; else --max-batch within the plan's limit."""
    requested = options.max_batch
    if requested is not None and requested < 0:
        raise export_error(f"--max-batch must be 0 or more, got {requested}.", "Pass e.g. --max-batch 8.")
    if not batches(plan):
        if requested:
            shapes = ", ".join(f"{t.name} {list(t.shape)}" for t in (*plan.inputs, *plan.outputs))
            raise export_error(
                f"This plan has no dynamic batch dimension shared by all inputs and outputs ({shapes}), so Triton "
                f"cannot batch it; --max-batch {requested} is impossible.",
                "Drop --max-batch (the model is served with max_batch_size 0), or rebuild the plan from a model "
                "with a dynamic batch dimension.",
            )
        return 0
    limit = profile_batch_limit(plan)
    title = _backend(plan).title
    if _backend(plan).profiled and limit is None and requested is None:
        raise export_error(
            f"This {title} plan does not record the largest batch its engine was built for (plans from before "
            "trtopt recorded optimisation profiles).",
            "Pass --max-batch with the --batch the plan was built with (1 if none was given).",
        )
    if limit is not None and requested is not None and requested > limit:
        raise export_error(
            f"--max-batch {requested} is larger than the batch this {title} engine was built for ({limit}).",
            f"Pass --max-batch {limit} or less, or rebuild the plan with `trtopt build ... --batch {requested}`.",
        )
    if requested is not None:
        return requested
    return limit if limit is not None else DEFAULT_CPU_MAX_BATCH


def batches(plan: Plan) -> bool:
    """Every input and output has a dynamic leading dimension and at least one more."""
    return all(len(t.shape) >= 2 and t.shape[0] == -1 for t in (*plan.inputs, *plan.outputs))


def profile_batch_limit(plan: Plan) -> int | None:
    """The largest batch every input's optimisation profile allows (plans of a `profiled` backend record
    their profiles in metadata["profiles"]: {input: {min, opt, max}}); None where nothing is recorded."""
    profiles = plan.metadata.get("profiles")
    if not _backend(plan).profiled or not isinstance(profiles, dict) or not profiles:
        return None
    limits = []
    for name, profile in profiles.items():
        top = profile.get("max") if isinstance(profile, dict) else None
        if not isinstance(top, (list, tuple)) or not top or not all(isinstance(d, int) and d >= 1 for d in top):
            raise export_error(
                f"The plan's recorded optimisation profile for {name!r} is malformed ({profile!r:.80}).",
                "Rebuild the plan with `trtopt build`.",
            )
        limits.append(top[0])
    return min(limits)


def _dynamic_batching(options: TritonOptions, max_batch: int) -> dict[str, Any] | None:
    wanted = options.dynamic_batching
    extras = options.queue_delay_us is not None or options.preferred_batch
    if max_batch == 0:
        if wanted or extras:
            raise export_error(
                "Dynamic batching needs a model that batches (max_batch_size > 0); this one is served with 0.",
                "Drop --dynamic-batching, --queue-delay-us and --preferred-batch for this plan.",
            )
        return None
    if wanted is False:
        if extras:
            raise export_error(
                "--queue-delay-us and --preferred-batch configure the dynamic batcher, which is switched off.",
                "Drop them, or use --dynamic-batching on.",
            )
        return None
    for size in options.preferred_batch:
        if not 1 <= size <= max_batch:
            raise export_error(
                f"--preferred-batch {size} is outside 1..{max_batch} (the model's max_batch_size).",
                f"Use sizes from 1 to {max_batch}.",
            )
    if options.queue_delay_us is not None and options.queue_delay_us < 0:
        raise export_error(f"--queue-delay-us must be 0 or more, got {options.queue_delay_us}.", "Pass e.g. 500.")
    batching: dict[str, Any] = {}
    if options.preferred_batch:
        batching["preferred_batch_size"] = sorted(set(options.preferred_batch))
    if options.queue_delay_us is not None:
        batching["max_queue_delay_microseconds"] = options.queue_delay_us
    return batching


def _tensor(t: TensorSpec, plan: Plan, max_batch: int, model: TritonModel, *, optional: bool = False) -> dict[str, Any]:
    if t.dtype not in model.dtypes:
        raise export_error(
            f"Tensor {t.name!r} is {t.dtype}, which Triton's {model.name} backend does not take.",
            f"Types it takes: {', '.join(sorted(model.dtypes))}. Export with another --triton-backend, or change the "
            "model's I/O type.",
        )
    dims = list(_fixed_dims(t, plan))[1 if max_batch else 0 :]
    entry: dict[str, Any] = {"name": t.name, "data_type": Enum(DTYPES[t.dtype]), "dims": dims}
    if optional:
        entry["optional"] = True
    return entry


def _fixed_dims(t: TensorSpec, plan: Plan) -> tuple[int, ...]:
    """A profiled input's non-batch dynamic dimensions are fixed by its profile (min = max): use them."""
    profile = (plan.metadata.get("profiles") or {}).get(t.name) if _backend(plan).profiled else None
    if not isinstance(profile, dict) or profile.get("min", [])[1:] != profile.get("max", [])[1:]:
        return t.shape
    top = profile["max"]
    if len(top) != len(t.shape):
        return t.shape
    return (t.shape[0], *(m if d == -1 else d for d, m in zip(t.shape[1:], top[1:], strict=True)))


def _takes_images(plan: Plan) -> bool:
    return bool(plan.preprocess) and len(plan.inputs) == 1


def image_input_name(plan: Plan) -> str:
    taken = {t.name for t in (*plan.inputs, *plan.outputs)}
    return next(n for n in (IMAGE_INPUT, f"{IMAGE_INPUT}_BYTES", "trtopt_image_bytes") if n not in taken)


def labelled_output(plan: Plan) -> int | None:
    """The output the plan's labels name (its last dimension has one entry per label), if any."""
    labels = plan.labels
    if not labels:
        return None
    broken = next((i for i, label in enumerate(labels) if "\n" in label or "\r" in label), None)
    if broken is not None:
        raise export_error(
            f"Label {broken} of the plan ({labels[broken]!r:.60}) holds a line break; Triton's label files hold one "
            "label per line.",
            "Rebuild the plan with --labels FILE (one label per line).",
        )
    for i, t in enumerate(plan.outputs):
        if len(t.shape) >= 1 and t.shape[-1] == len(labels):
            return i
    return None


def _parameters(options: TritonOptions, model: TritonModel) -> list[dict[str, Any]]:
    params: dict[str, str] = {}
    if options.threads is not None:
        if options.threads < 1:
            raise export_error(f"--threads must be at least 1, got {options.threads}.", "Pass e.g. --threads 1.")
        if model.threads_parameter is None:
            raise export_error(
                f"--threads sets CPU threads; Triton's {model.name} backend runs the model on the GPU.",
                "Drop --threads.",
            )
        params[model.threads_parameter] = str(options.threads)
    if options.python_env is not None:
        if model != PYTHON_MODEL:
            raise export_error("--python-env is for the Python backend.", "Add --triton-backend python, or drop it.")
        # The python backend's custom execution environment (python_backend README, "Creating Custom Execution
        # Environments"): a packed tarball or an unpacked folder with bin/activate, given as an absolute path on
        # the server or one under $$TRITON_MODEL_DIRECTORY (the model's folder).
        env = options.python_env
        if not (env.startswith("/") or env.startswith("$$TRITON_MODEL_DIRECTORY/")):
            raise export_error(
                f"--python-env {env!r} must be an absolute path on the server, or start with "
                "$$TRITON_MODEL_DIRECTORY/ for an environment inside the model's folder.",
                "Pass e.g. --python-env /opt/envs/trtopt or '--python-env $$TRITON_MODEL_DIRECTORY/env.tar.gz'.",
            )
        params["EXECUTION_ENV_PATH"] = env
    return [{"key": k, "value": {"string_value": v}} for k, v in params.items()]


def check_model_name(name: str) -> str:
    if not _MODEL_NAME.fullmatch(name):
        raise export_error(
            f"{name!r} cannot be a model name: Triton takes it as a folder name in the repository and in URLs.",
            "Pass --name with letters, digits, '_', '.' and '-' only (up to 128 characters, not starting with "
            "'.' or '-').",
        )
    return name
