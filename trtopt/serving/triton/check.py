"""Check a written Triton model folder before it is put in place: the configuration read back from disk says
what was meant and fits the plan, and every file holds what the plan holds.

The checks restate Triton's rules (see `trtopt.serving.triton.config` for the sources) rather than reuse the
code that wrote the configuration, so a mistake in one is caught by the other. Where `tritonclient` is
installed, the text is also parsed against Triton's own schema (`model_config_pb2`, generated from
model_config.proto), which refuses any misspelt field or enum value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtopt.backend import get_backend
from trtopt.errors import TrtoptError
from trtopt.plan import Plan
from trtopt.serving.triton.config import DTYPES, LABELS_FILE, REPEATED, triton_model
from trtopt.serving.triton.pbtxt import Enum, dict_from_pbtxt


class ExportCheckError(TrtoptError):
    """What the exporter wrote is not what the plan needs: a bug in trtopt, never written into place."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"The exported Triton model failed its own check: {what}.",
            fix="Nothing was written. Please report this with the plan's `trtopt export --info` output.",
        )


def check_repository_model(folder: Path, plan: Plan, meant: dict[str, Any], backend: str) -> None:
    text = (folder / "config.pbtxt").read_text(encoding="utf-8")
    config = dict_from_pbtxt(text, REPEATED)
    if config != meant:
        raise ExportCheckError("config.pbtxt does not read back as the configuration that was written")
    check_with_triton_schema(text)
    check_config(config, plan, backend)
    _check_files(folder, plan, config, backend)


def check_with_triton_schema(text: str) -> bool:
    """Parse with Triton's generated schema where tritonclient is installed; False where it is not."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        return False
    try:
        text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ExportCheckError(f"Triton's model_config schema refuses config.pbtxt ({exc})") from None
    return True


def check_config(config: dict[str, Any], plan: Plan, backend: str) -> None:
    """Triton's rules, and agreement with the plan's inputs and outputs (`backend`: the Triton backend)."""
    model = triton_model(backend)
    if config.get(model.key) != model.value:
        raise ExportCheckError(f"{model.key} is {config.get(model.key)!r}, expected {model.value!r}")
    max_batch = config.get("max_batch_size")
    if not isinstance(max_batch, int) or max_batch < 0:
        raise ExportCheckError(f"max_batch_size {max_batch!r} is not a count")
    batch = 1 if max_batch > 0 else 0
    _check_tensors("input", config, [t for t in plan.inputs], batch, plan)
    _check_tensors("output", config, list(plan.outputs), batch, plan)
    batching = config.get("dynamic_batching")
    if batching is not None:
        if max_batch == 0:
            raise ExportCheckError("dynamic_batching on a model with max_batch_size 0")
        if any(not 1 <= s <= max_batch for s in batching.get("preferred_batch_size", [])):
            raise ExportCheckError("a preferred_batch_size beyond max_batch_size")
    kind = Enum(get_backend(plan.backend).triton.instance_kind)
    groups = config.get("instance_group", [])
    bad = [g for g in groups if g.get("kind") != kind or not isinstance(g.get("count"), int) or g["count"] < 1]
    if not groups or bad:
        raise ExportCheckError(f"instance_group must be {kind.name} with a count of at least 1, got {groups}")


def _check_tensors(key: str, config: dict[str, Any], specs: list[Any], batch: int, plan: Plan) -> None:
    entries = {e["name"]: e for e in config.get(key, [])}
    extra = sorted(set(entries) - {t.name for t in specs})
    if extra and not (key == "input" and all(entries[n]["data_type"] == Enum("TYPE_STRING") for n in extra)):
        raise ExportCheckError(f"{key} lists {extra}, which the plan does not have")
    for spec in specs:
        entry = entries.get(spec.name)
        if entry is None:
            raise ExportCheckError(f"{key} {spec.name!r} of the plan is missing")
        if entry.get("data_type") != Enum(DTYPES[spec.dtype]):
            raise ExportCheckError(f"{key} {spec.name!r} has data_type {entry.get('data_type')}, the plan {spec.dtype}")
        dims = entry.get("dims", [])
        if not dims or len(dims) + batch != len(spec.shape):
            raise ExportCheckError(f"{key} {spec.name!r} has dims {dims} for plan shape {list(spec.shape)}")
        if batch and spec.shape[0] != -1:
            raise ExportCheckError(f"{key} {spec.name!r} is batched but its plan shape {list(spec.shape)} is not")
        if any(p not in (-1, d) for p, d in zip(spec.shape[batch:], dims, strict=True)) or min(dims) < -1 or 0 in dims:
            shape = list(spec.shape)
            raise ExportCheckError(f"{key} {spec.name!r} has dims {dims}, which contradict the plan's {shape}")


def _check_files(folder: Path, plan: Plan, config: dict[str, Any], backend: str) -> None:
    from trtopt.plan import read_plan
    from trtopt.serving.triton.python_model import PLAN_FILE

    version = folder / "1"
    model = triton_model(backend)
    model_file = version / model.file
    if model.section is not None and model_file.read_bytes() != plan.sections[model.section]:
        raise ExportCheckError(f"{model.file} differs from the plan's {model.section!r} section")
    if model.file.endswith(".onnx"):
        _check_onnx(model_file, plan)
    if model.section is None:
        compile(model_file.read_text(encoding="utf-8"), str(model_file), "exec")
        if read_plan(version / PLAN_FILE).header() != plan.header():
            raise ExportCheckError(f"{PLAN_FILE} is not the plan that was exported")
    labelled = [o for o in config["output"] if o.get("label_filename")]
    if labelled:
        lines = (folder / LABELS_FILE).read_text(encoding="utf-8").splitlines()
        if lines != list(plan.labels or []) or labelled[0]["dims"][-1] != len(lines):
            raise ExportCheckError(f"{LABELS_FILE} does not hold one label per class of {labelled[0]['name']!r}")


def _check_onnx(path: Path, plan: Plan) -> None:
    import onnx

    model = onnx.load_model(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    outputs = [o.name for o in model.graph.output]
    if sorted(inputs) != sorted(t.name for t in plan.inputs) or sorted(outputs) != sorted(t.name for t in plan.outputs):
        raise ExportCheckError(f"model.onnx takes {inputs} and gives {outputs}, unlike the plan")
