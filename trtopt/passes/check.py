"""`trtopt optimize` checks the model it is about to write: ONNX Runtime must load it, and on one random feed it
must compute what the model computes. Where that fails nothing is written. `trtopt build` checks the graph it
quantises and verifies against the same way, on its first verification batch, against the model file itself
(`check_against_file`): the build's verification compares the plan with that graph, so a loader or pass error
would otherwise go unseen.

Silero VAD's 16 kHz export is why: the loader's constant folding once left an `If` output without a producer,
and `trtopt optimize` wrote a model nothing could load, with a report saying all was well. The passes' tests
check every transform on the zoo and on random graphs; this check covers the model in hand.

The comparison runs both models with ONNX Runtime's optimisations off, so that only trtopt's rewrites differ,
and allows `RTOL` of each output's largest value: BatchNorm folding moves outputs by about 1e-6 of it, a wrong
rewrite (a dropped bias, a lost branch) by 1e-2 and more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.errors import ModelError, ShapeError
from trtopt.frontend.float_types import lifted_to_float32, low_float_uses

RTOL = 1e-3
# A sigmoid map saturated near 0 (PP-OCRv4-det on noise: largest value 5.9e-5) differs by float rounding alone
# (1.5e-7 where ONNX Runtime flushes one value to 0): 2.5e-3 of its largest value. Outputs whose values are all
# below SCALE_FLOOR are measured against it instead, allowing RTOL * SCALE_FLOOR (1e-5) absolute.
SCALE_FLOOR = 1e-2
# A float16 model against its float32 copy (trtopt.frontend.float_types): float16 keeps 11 bits, and ONNX Runtime
# rounds to it between the layers it runs in float16: 1.8e-4 of the largest output on EfficientNet-Lite0 converted
# to float16, 7.9e-4 on torch's `.half()` ResNet-18. A lost constant or a broken Cast moves outputs far more.
LOW_RTOL = 2e-2
INT_SHARE = 0.01  # integer outputs (class ids): the share of values allowed to differ
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})  # fmt: skip
_LOW_FIX = ("The model's own float16 rounding or overflow changes its outputs this much, so INT8 calibrated on "
            "float32 would quantise another function. Build from the model's float32 export (torch: export "
            "without .half()), or build without --int8 to take the model as it is.")
_FIX = ("This is a trtopt bug: please report it with the model. Meanwhile leave out the pass that breaks it "
        "(--passes with the others; `trtopt inspect` lists them).")  # fmt: skip


def random_ops(ops: Iterable[str]) -> list[str]:
    """The ops among `ops` that draw random numbers (two runs of the model then differ), sorted, once each."""
    return sorted(set(ops) & RANDOM_OPS)


@dataclass(frozen=True)
class OptimizeCheck:
    """What the check did: `error` is the largest relative output error, None where it did not compare."""

    error: float | None
    note: str

    def to_dict(self) -> dict[str, object]:
        return {"max_relative_error": self.error, "note": self.note}


@dataclass(frozen=True)
class Reference:
    """The model's outputs on one random feed, or why there are none."""

    feeds: dict[str, np.ndarray] | None
    outputs: dict[str, np.ndarray] | None
    why_not: str = ""


def reference(graph: gs.Graph) -> Reference:
    """Run the loaded, not yet optimised `graph` on one random feed (standard normal floats, zeros for integers;
    a dynamic first dimension of 1). Dynamic sizes past it cannot be guessed: then nothing runs."""
    from trtopt.data.inputs import input_infos_from_graph, random_array
    from trtopt.execution.ort_session import run_model

    drawn = random_ops(n.op for n in graph.nodes)
    if drawn:
        return Reference(None, None, f"the model draws random numbers ({', '.join(drawn)})")
    rng = np.random.default_rng(0)
    feeds = {}
    for info in input_infos_from_graph(graph):
        if any(d is None for d in info.shape[1:]):
            return Reference(None, None, f"input {info.name!r} has dynamic sizes (set them with --shapes to check)")
        shape = [d or 1 for d in info.shape]  # only the first can be None here
        feeds[info.name] = random_array(rng, shape, info.dtype)
    try:
        return Reference(feeds, run_model(graph, feeds, opt_level="disable"))
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's errors have many types; the model is not trtopt's
        return Reference(None, None, f"ONNX Runtime cannot run the model as given ({_first_line(exc)})")


def check_optimized(model: onnx.ModelProto, ref: Reference, what: str = "optimised model") -> OptimizeCheck:
    """Load `model` in ONNX Runtime and compare it with `ref`; raise `ModelError` where it is wrong (`what` names
    the model in the message)."""
    session = _session(model, what)
    if ref.feeds is None or ref.outputs is None:
        return OptimizeCheck(None, f"loads in ONNX Runtime; outputs not compared: {ref.why_not}")
    error, flipped = _compared(ref.outputs, session.run(ref.feeds), what)
    return OptimizeCheck(error, f"outputs equal the model's on 1 random feed ({_found(error, flipped)})")


def _compared(
    wanted: dict[str, np.ndarray], got: dict[str, np.ndarray], what: str, rtol: float = RTOL, fix: str = _FIX
) -> tuple[float, float]:
    """(largest relative error of the float outputs, largest share of differing values of the integer ones);
    `ModelError` where an output is missing or past `rtol` / `INT_SHARE`."""
    error = flipped = 0.0
    for name, want in wanted.items():
        have = got.get(name)
        if have is None or np.shape(have) != np.shape(want):
            shape = np.shape(have) if have is not None else "none"
            raise ModelError(f"The {what}'s output {name!r} is missing or has another shape ({shape} vs "
                             f"{np.shape(want)}); nothing written.", fix=fix)  # fmt: skip
        want, have = np.asarray(want), np.asarray(have)
        if want.dtype.kind in "fc":
            error = max(error, _relative_error(want, have))
        elif want.size:  # ids from an ArgMax: float rounding may flip a near-tie, not a share of them
            flipped = max(flipped, float(np.mean(want != have)))
    if not error <= rtol or flipped > INT_SHARE:
        raise ModelError(f"The {what} computes something else: its outputs differ from the model's by {error:.2e} "
                         f"of their largest value (allowed {rtol:g}), its integer outputs at {flipped:.2%} of their "
                         f"values (allowed {INT_SHARE:.0%}); nothing written.", fix=fix)  # fmt: skip
    return error, flipped


def _session(model: onnx.ModelProto, what: str) -> Any:
    from trtopt.execution.ort_session import OrtSession

    try:
        return OrtSession(model, opt_level="disable")
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's errors have many types
        raise ModelError(f"The {what} does not load in ONNX Runtime: {_first_line(exc)}; nothing written.",
                         fix=_FIX) from None  # fmt: skip


def _found(error: float, flipped: float) -> str:
    ints = f", integer outputs differ at {flipped:.3%} of their values" if flipped else ""
    return f"max relative error {error:.1e}{ints}"


def check_against_file(
    path: Path, graph_model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, lifted: bool = False
) -> OptimizeCheck:
    """`trtopt build`'s check of everything before quantisation (loading: opset conversion, shapes, constant
    folding, `If` flattening; then the graph passes): the model file as given and the optimised graph, both with
    ONNX Runtime's optimisations off, on `feeds` (the first verification batch). Raises `ModelError` where they
    differ; where ONNX Runtime cannot run the file itself, says so and compares nothing.

    `lifted`: an INT8 build, whose graph computes a float16 model in float32 (`trtopt.frontend.float_types`). The
    file's float32 copy is then checked against the file within float16's rounding (`LOW_RTOL`), and the graph
    against the copy as closely as ever (`RTOL`)."""
    from trtopt.data.arrays import samples_in
    from trtopt.execution.ort_session import OrtSession
    from trtopt.frontend.loader import with_supported_ir

    model = None
    try:
        model = onnx.load(str(path))
        drawn = random_ops(n.op_type for n in model.graph.node)
        if drawn:  # two runs draw different numbers: nothing to compare
            return OptimizeCheck(None, f"not compared: the model draws random numbers ({', '.join(drawn)})")
        original = OrtSession(with_supported_ir(model), opt_level="disable")
        wanted = original.run(feeds)
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's errors have many types; the file is not trtopt's
        why = _first_line(exc)
        if model is not None:
            refuse_batch_of_one(model, graph_model, feeds, str(exc))
        return OptimizeCheck(None, f"not compared: ONNX Runtime cannot run the model file as given ({why})")
    copy = ""
    if lifted and low_float_uses(model):
        wanted, copy = _float32_copy(model, wanted, feeds)
    what = "graph trtopt builds from the model"
    session = _session(graph_model, what)
    error, flipped = _compared(wanted, session.run(feeds), what)
    rows = samples_in(feeds, graph_model)  # 1 for one whole feed (a [3, H, W] image input)
    found = f"equals the model file{copy} on {rows} verification input(s) ({_found(error, flipped)})"
    return OptimizeCheck(error, found)


class OneSamplePerCall(ShapeError):
    """The model declares a dynamic batch but runs one sample per call (`refuse_batch_of_one`)."""


def refuse_batch_of_one(model: onnx.ModelProto, graph_model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                        error: str) -> None:
    """Raise `OneSamplePerCall` when `model` fails on `feeds`, a batch of several samples along the dynamic
    leading axis its inputs declare, but runs their first sample alone: an export that fixed the batch inside
    the graph (khmersm's `Reshape` to [seq, 1, heads, dim] after a torch `view`; docs/holdout.md round 8).
    Without this, the build stopped later at "ONNX Runtime rejected the inputs" with a fix about shapes and
    dtypes; `trtopt.build` now goes on one sample per call, and `Engine` runs a batch one sample at a time."""
    from trtopt.execution.ort_session import OrtSession
    from trtopt.frontend.loader import with_supported_ir

    declared = [v for v in graph_model.graph.input if v.name in feeds]
    leading = [v.type.tensor_type.shape.dim[0] for v in declared if len(v.type.tensor_type.shape.dim)]
    rows = {np.shape(feeds[v.name])[0] for v in declared if np.ndim(feeds[v.name])}
    if not leading or any(d.HasField("dim_value") for d in leading) or len(rows) != 1 or rows.pop() < 2:
        return  # no dynamic batch axis shared by every input, or one sample already
    try:
        OrtSession(with_supported_ir(model), opt_level="disable").run({k: v[:1] for k, v in feeds.items()})
    except Exception:  # noqa: BLE001 - it fails on one sample too: not a batch problem
        return
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", error)
    shapes = re.search(r"Input shape:\{[^}]*\}, requested shape:\{[^}]*\}", error)
    at = f"at {node[1]} {node[2]!r}" if node else error.strip().splitlines()[0][:200]
    at += f": {shapes[0]}" if shapes else ""
    raise OneSamplePerCall(
        f"The model declares a dynamic batch but runs only one sample per call: ONNX Runtime runs it on one sample "
        f"and fails on a batch of {len(next(iter(feeds.values())))} ({at}). Its export fixed the batch inside the "
        "graph (a Reshape or view to 1 where the batch goes).",
        fix="trtopt build goes on one sample per call (as --calib-batch 1 does) and Engine runs such a plan's batches "
        "one sample at a time; for full batches, re-export the model with a batch it can vary (torch: no "
        "view/reshape with the batch written as 1).",
    )


def _float32_copy(
    model: onnx.ModelProto, wanted: dict[str, np.ndarray], feeds: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], str]:
    """The outputs of the float16 `model`'s float32 copy on `feeds`, checked against the file's (`wanted`), and
    the words for the build's summary. `model`'s IR version is capped already (`check_against_file`)."""
    what = "float32 copy of this float16 model (INT8 calibrates and verifies on it)"
    outputs = _session(lifted_to_float32(model), what).run(feeds)
    error, _ = _compared(wanted, outputs, what, rtol=LOW_RTOL, fix=_LOW_FIX)
    return outputs, f"'s float32 copy (the copy differs from the float16 file by {error:.1e}: float16 rounding)"


def _relative_error(want: np.ndarray, have: np.ndarray) -> float:
    """Largest difference over the output's largest value, or over `SCALE_FLOOR` where all are smaller. NaN and
    infinities follow the verification's rule (`trtopt.metrics.agreement.comparable`): the same non-finite value in both
    is no difference, and the finite values beside it are measured; one anywhere else is an infinite error."""
    from trtopt.metrics.agreement import comparable

    if not want.size:
        return 0.0
    have, want = comparable(have.astype(np.float64), want.astype(np.float64))
    with np.errstate(invalid="ignore"):  # inf - inf where only the signs differ: NaN, an infinite error below
        diff = np.abs(want - have)
    if not np.isfinite(diff).all():
        return float("inf")
    return float(diff.max() / max(float(np.max(np.abs(want))), SCALE_FLOOR))


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "what", None) or exc).strip()  # a TrtoptError's message without its fix
    return text.splitlines()[0][:300] if text else type(exc).__name__
