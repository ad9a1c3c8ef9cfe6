"""The Python-backend model that serves a plan through `trtopt.Engine` inside Triton Inference Server.

The exported repository's `model.py` only re-exports `TritonPythonModel` from here, so the code that runs
in the server is trtopt's own, versioned and tested with it. Triton's python backend contract
(https://github.com/triton-inference-server/python_backend, "Usage"): a class `TritonPythonModel` whose
`initialize(args)` gets the model's configuration as JSON and its folder, and whose `execute(requests)`
returns one `InferenceResponse` per request, in order; a response may carry a `TritonError` instead of
outputs, which fails that request alone. `triton_python_backend_utils` exists only inside the stub process,
so it is imported when the model is initialised (tests pass a stand-in).

Each `execute` call gets the requests the dynamic batcher grouped. Requests may send encoded images
(the IMAGE input, TYPE_STRING: each row one JPEG/PNG/... file's bytes), which are decoded and preprocessed
as `Engine.preprocess` does (the plan's stored spec, JPEG draft decoding, the same limits on image size),
or the plan's own input tensors. All good requests run as one batch, then the outputs are split back per
request; a request whose image cannot be read, or whose tensors do not fit, gets its own error. Labels come
from Triton's classification extension (the output's `label_filename`, written by the exporter).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trtopt.errors import TrtoptError

PLAN_FILE = "plan.engine"  # the plan, in the model's version folder beside model.py


class TritonPythonModel:
    """One model instance: one Engine (CPU plans: `threads` intra-op threads; TensorRT: this instance's GPU)."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils  # only inside Triton's stub process

        self.pb = pb_utils
        self.configure(args)

    def configure(self, args: dict[str, str], pb_utils: Any = None) -> None:
        """`initialize` without the import (tests pass their stand-in `pb_utils`)."""
        from trtopt.engine import Engine

        if pb_utils is not None:
            self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        folder = Path(args["model_repository"]) / str(args["model_version"])
        gpu = args.get("model_instance_kind") == "GPU"
        self.engine = Engine.load(
            folder / PLAN_FILE,
            threads=None if gpu else _threads(params, config),
            device=int(args.get("model_instance_device_id") or 0) if gpu else 0,
        )
        strings = [i["name"] for i in config.get("input", []) if i.get("data_type") == "TYPE_STRING"]
        self.image_input = strings[0] if strings else None
        self.tensor_inputs = [t.name for t in self.engine.inputs]
        self.output_names = [o["name"] for o in config.get("output", [])]

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        feeds: list[dict[str, np.ndarray] | None] = []
        errors: list[str | None] = []
        for request in requests:
            try:
                feeds.append(self._feeds(request))
                errors.append(None)
            except TrtoptError as exc:
                feeds.append(None)
                errors.append(str(exc))
        outputs = self._run([f for f in feeds if f is not None], errors, feeds)
        return [self._response(out, err) for out, err in zip(outputs, errors, strict=True)]

    def finalize(self) -> None:
        self.engine.close()

    def _feeds(self, request: Any) -> dict[str, np.ndarray]:
        images = self.pb.get_input_tensor_by_name(request, self.image_input) if self.image_input else None
        tensors = {n: self.pb.get_input_tensor_by_name(request, n) for n in self.tensor_inputs}
        given = [n for n, t in tensors.items() if t is not None]
        if images is not None and given:
            raise TrtoptError(f"Send either {self.image_input!r} (encoded images) or the tensors {given}, not both.")
        if images is not None:
            rows = images.as_numpy().reshape(-1)
            return {self.tensor_inputs[0]: self.engine.preprocess([_as_bytes(r, i) for i, r in enumerate(rows)])}
        if len(given) != len(self.tensor_inputs):
            accepted = [self.image_input, "or"] if self.image_input else []
            raise TrtoptError(f"The request sends no input this model takes: send {[*accepted, *self.tensor_inputs]}.")
        return {n: t.as_numpy() for n, t in tensors.items()}

    def _run(
        self, good: list[dict[str, np.ndarray]], errors: list[str | None], feeds: list[dict[str, np.ndarray] | None]
    ) -> list[dict[str, np.ndarray] | None]:
        """One Engine call for every request that batches with the others (same trailing shapes), split back;
        a request that cannot run with the others runs alone, so only its own answer can fail."""
        results: list[dict[str, np.ndarray] | None] = [None] * len(feeds)
        index = [i for i, f in enumerate(feeds) if f is not None]
        if not index:
            return results
        try:
            merged = {n: np.concatenate([f[n] for f in good]) for n in self.tensor_inputs}
            outputs = self.engine.infer(merged)
        except (TrtoptError, ValueError):  # shapes that do not stack, or inputs the plan refuses
            for i in index:
                results[i] = self._alone(feeds[i], errors, i)  # type: ignore[arg-type]
            return results
        start = 0
        for i, f in zip(index, good, strict=True):
            rows = len(f[self.tensor_inputs[0]])
            results[i] = {n: v[start : start + rows] for n, v in outputs.items()}
            start += rows
        return results

    def _alone(self, feed: dict[str, np.ndarray], errors: list[str | None], i: int) -> dict[str, np.ndarray] | None:
        try:
            return self.engine.infer(feed)
        except TrtoptError as exc:
            errors[i] = str(exc)
            return None

    def _response(self, outputs: dict[str, np.ndarray] | None, error: str | None) -> Any:
        if outputs is None:
            return self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(error or "failed"))
        tensors = [self.pb.Tensor(n, np.ascontiguousarray(outputs[n])) for n in self.output_names]
        return self.pb.InferenceResponse(output_tensors=tensors)


def _threads(params: dict[str, str], config: dict[str, Any]) -> int:
    """The "threads" parameter, else this machine's CPUs shared evenly by the model's CPU instances."""
    if params.get("threads"):
        return max(1, int(params["threads"]))
    instances = sum(int(g.get("count") or 1) for g in config.get("instance_group") or [{}])
    return max(1, (os.cpu_count() or 1) // max(1, instances))


def _as_bytes(value: Any, row: int) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):  # a client that sent text: not an encoded image
        raise TrtoptError(f"Image {row} arrived as text, not as the bytes of an image file.")
    raise TrtoptError(f"Image {row} is a {type(value).__name__}, not the bytes of an image file.")
