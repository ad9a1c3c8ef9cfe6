"""`trtopt export plan.engine --triton REPO/`: a plan as a model in a Triton Inference Server repository.

Layout (Triton's model repository guide,
https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_repository.md)::

    REPO/NAME/config.pbtxt      the model configuration (`trtopt.serving.triton.config`)
    REPO/NAME/labels.txt        class names, one per line, when the plan has labels (label_filename)
    REPO/NAME/1/model.plan      tensorrt: the serialised engine (the plan's "engine" section)
    REPO/NAME/1/model.onnx      onnxruntime: the plan's lowered ONNX model
    REPO/NAME/1/model.py        python: re-exports trtopt.serving.triton.python_model.TritonPythonModel,
    REPO/NAME/1/plan.engine       which serves this plan file through trtopt.Engine

Version folder 1, and the default file names each backend looks for, follow that guide. The model is
written into a temporary folder inside REPO, checked (the configuration is parsed back and compared with
what was meant and with the plan; every file is read back), and only then renamed to REPO/NAME, so an
error or an interrupt leaves nothing half-written. An existing REPO/NAME is never replaced.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtopt.backend import TritonModel, get_backend
from trtopt.errors import TrtoptError
from trtopt.frontend.writer import write_fix
from trtopt.plan import Plan, read_plan
from trtopt.serving.triton.check import check_repository_model
from trtopt.serving.triton.config import (
    LABELS_FILE,
    PYTHON_MODEL,
    TritonOptions,
    check_model_name,
    check_plan_model,
    default_model,
    model_config,
)
from trtopt.serving.triton.pbtxt import pbtxt_from_dict
from trtopt.serving.triton.python_model import PLAN_FILE

VERSION = "1"
MODEL_PY = '''"""Triton Python-backend model for a trtopt plan, written by `trtopt export --triton`.

It serves plan.engine (beside this file) through trtopt.Engine. The Python that Triton's python backend
stub runs must have trtopt installed (pip install trtopt), or the model's config.pbtxt must name such an
environment in EXECUTION_ENV_PATH (trtopt export --python-env).
"""

from trtopt.serving.triton.python_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
'''


@dataclass(frozen=True)
class ExportReport:
    path: Path  # REPO/NAME
    name: str
    backend: str
    max_batch_size: int
    dynamic_batching: bool
    instances: int
    files: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


def export_triton(
    plan_path: str | os.PathLike[str], repo: str | os.PathLike[str], options: TritonOptions | None = None
) -> ExportReport:
    """Write the plan as a model of the Triton repository `repo` (created if missing); see the module docs."""
    options = options or TritonOptions()
    plan_path = Path(plan_path)
    plan = read_plan(plan_path)
    model = check_plan_model(plan, options.backend or default_model(plan))
    backend = model.name
    name = check_model_name(options.name or plan_path.stem)
    config = model_config(plan, options, name, model)
    files = _files(plan, plan_path, config, model)
    created = [p for p in (Path(repo), *Path(repo).absolute().parents) if not p.exists()]  # removed on failure
    target = _target(Path(repo), name)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=target.parent))
    try:
        for relative, data in files.items():
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            (staging / relative).write_bytes(data)
        check_repository_model(staging, plan, config, backend)
        if target.exists():  # appeared while we wrote
            raise _exists(target)
        os.rename(staging, target)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in created:  # deepest first: nothing of a failed export stays behind
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(exc, OSError):  # a full disk, a file-size limit: the user's to fix
            raise TrtoptError(f"Could not write the Triton model {str(target)!r}: {exc.strerror or exc}. "
                              "Nothing was left in the repository.", fix=write_fix(exc)) from None
        raise
    return ExportReport(
        path=target,
        name=name,
        backend=backend,
        max_batch_size=config["max_batch_size"],
        dynamic_batching="dynamic_batching" in config,
        instances=options.instances,
        files=tuple(sorted(files)),
        notes=_notes(plan, model, options),
    )


def _files(plan: Plan, plan_path: Path, config: dict[str, Any], model: TritonModel) -> dict[str, bytes]:
    files = {"config.pbtxt": _header(plan, plan_path).encode() + pbtxt_from_dict(config).encode()}
    if any(o.get("label_filename") for o in config["output"]):
        files[LABELS_FILE] = "".join(f"{label}\n" for label in plan.labels or []).encode()
    if model.section is not None:  # the file Triton's backend loads is the plan's own section
        files[f"{VERSION}/{model.file}"] = plan.sections[model.section]
    else:
        files[f"{VERSION}/{model.file}"] = MODEL_PY.encode()
        files[f"{VERSION}/{PLAN_FILE}"] = plan_path.read_bytes()
    return files


def _header(plan: Plan, plan_path: Path) -> str:
    from trtopt._version import __version__

    versions = ", ".join(f"{k} {v}" for k, v in sorted(plan.versions.items()))
    made = f"# Written by trtopt {__version__} (`trtopt export --triton`) from {plan_path.name}: a {plan.backend} plan"
    return made + (f" ({versions})\n" if versions else "\n")


def _target(repo: Path, name: str) -> Path:
    if repo.exists() and not repo.is_dir():
        raise TrtoptError(
            f"--triton {str(repo)!r} is a file; a Triton model repository is a folder.",
            fix="Give a folder (it is created if missing).",
        )
    try:
        repo.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrtoptError(
            f"Cannot create the model repository {str(repo)!r}: {exc.strerror or exc}.",
            fix="Choose a folder you can write to.",
        ) from None
    if not os.access(repo, os.W_OK | os.X_OK):
        raise TrtoptError(
            f"The model repository {str(repo)!r} is not writable.",
            fix="Choose a folder you can write to.",
        )
    target = repo / name
    if target.exists() or target.is_symlink():
        raise _exists(target)
    return target


def _exists(target: Path) -> TrtoptError:
    return TrtoptError(
        f"{str(target)!r} already exists; trtopt does not replace a model in a repository.",
        fix="Remove it first, or pass --name to export under another name.",
    )


def _notes(plan: Plan, model: TritonModel, options: TritonOptions) -> tuple[str, ...]:
    notes = get_backend(plan.backend).triton_notes(plan, model)
    if model == PYTHON_MODEL and options.python_env is None:
        notes.append(
            "the Python backend's stub must import trtopt: pip install trtopt into the server's Python, or name an "
            "environment with trtopt in it with --python-env (EXECUTION_ENV_PATH)."
        )
    return tuple(notes)
