"""The data stage of a build: the preprocessing a model's images get, its calibration samples, and the
samples the build verifies its plan on."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtopt.data.config import DataConfig, PreprocessConfig
from trtopt.data.dataset import Dataset, holds_only_arrays, load_dataset
from trtopt.data.embedded_recipe import embedded_recipe
from trtopt.data.input_spec import spec_for_input
from trtopt.data.inputs import image_dims, input_infos_from_graph, random_array
from trtopt.data.preprocess import PreprocessSpec
from trtopt.errors import DataError, InputsRejected, ShapeError, TrtoptError

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs
log = logging.getLogger(__name__)


def preprocess_spec_for(
    model_path: Path, graph: gs.Graph, config: PreprocessConfig, data: DataConfig | None = None
) -> PreprocessSpec | None:
    """Preprocessing for image data: `config.preset`, else the model's sidecar `<model>.json`, else what its
    exporter wrote into the model file (`trtopt.data.embedded_recipe`), else ImageNet's; then the fields given
    one by one (`config.overrides`: --mean, --std, ...) over it. None for a model whose input takes no images
    (data must then come as .npy/.npz, and the plan stores none), and when the default recipe does not fit the
    input (a grey input against ImageNet's per-channel mean) and no images are read: arrays are fed as they
    are, and the default was only a guess for images, so it is neither applied nor checked (an FP32 build
    without data stores none and says so). With images, that misfit is an error that says what to pass."""
    image_inputs = [t for t in graph.inputs if t.shape is not None and len(image_dims(t.shape)) == 4]
    if len(graph.inputs) != 1 and (config.overrides or config.preset is not None):
        from trtopt.data.overrides import refuse_for_multi_input

        refuse_for_multi_input([t.name for t in graph.inputs])
    if len(graph.inputs) != 1 or not image_inputs:
        return None
    tensor = image_inputs[0]
    overrides = config.overrides
    described = _described(model_path, config, tuple(tensor.shape))
    if described:
        spec = PreprocessSpec.from_dict(described[0], where=described[1])
        return overrides.apply(spec, name=tensor.name, input_shape=tuple(tensor.shape))
    try:
        return spec_for_input(tuple(tensor.shape), tensor.dtype, config.preset, name=tensor.name, overrides=overrides)
    except ShapeError:
        if config.preset is not None or overrides:
            raise
        return None
    except DataError as exc:
        if config.preset is not None or overrides or (data and not _arrays_only(data)):
            raise
        log.warning("input %r: the default preprocessing does not fit (%s); the plan stores none, so `trtopt run` "
                    "takes .npy/.npz for it, or images with --mean and --std", tensor.name, exc.what)  # fmt: skip
        return None


def preprocess_source(model_path: Path, config: PreprocessConfig) -> str:
    """Where `preprocess_spec_for`'s recipe comes from, in words: a wrong guess is invisible in every figure the
    build measures (MTCNN's ONet verified at cosine 0.996 on images fed with ImageNet's mean and std; round 13's
    hunt), so the build summary says it."""
    flags = config.overrides.changes()
    given = f", then {', '.join('--' + k.replace('_', '-') for k in flags)}" if flags else ""
    sidecar = model_path.with_suffix(".json").name
    if config.preset:
        return f"--preset {config.preset}{given}"
    if _sidecar_recipe(model_path):
        return f"from {sidecar}{given}"
    embedded = embedded_recipe(model_path, ())
    if embedded:
        return f"from {embedded[1]}{given}"
    if flags:
        return f"the default for its input{given}"
    return (
        f"the default for its input, a guess: no --preset, no flags, no {sidecar}; pass --preset or "
        "--mean/--std/--scale/--color if the model expects other"
    )


def _described(model_path: Path, config: PreprocessConfig, shape: tuple[Any, ...]) -> tuple[dict[str, Any], str] | None:
    """The recipe the sidecar or the exporter's metadata gives (fields, where from), unless --preset replaces it."""
    if config.preset is not None:
        return None
    sidecar = _sidecar_recipe(model_path)
    if sidecar:
        return sidecar, str(model_path.with_suffix(".json"))
    return embedded_recipe(model_path, shape)


def _sidecar_recipe(model_path: Path) -> dict[str, Any] | None:
    """The `preprocess` entry of the model's sidecar `<model>.json` (None: no sidecar, or none in it)."""
    sidecar = model_path.with_suffix(".json")
    if not sidecar.is_file():
        return None
    return json.loads(sidecar.read_text()).get("preprocess") or None


def _arrays_only(data: DataConfig) -> bool:
    """Whether every sample the build reads (--calib, --verify-data) is a .npy/.npz array (none: True)."""
    return all(holds_only_arrays(source) for source in (*data.sources, *data.verify_sources))


def load_samples(graph: gs.Graph, spec: PreprocessSpec | None, data: DataConfig, count: int | None = None) -> Dataset:
    """The first `count` (None: `data.count`, None: all) samples of `data.sources`, shaped for `graph`'s inputs."""
    return load_dataset(data.source, input_infos_from_graph(graph), spec, count=count or data.count)


def calibration_and_checks(
    graph: gs.Graph,
    spec: PreprocessSpec | None,
    data: DataConfig,
    checks: int,
    *,
    calibrating: bool,
    from_cache: bool,
) -> tuple[Dataset | None, Checks]:
    """(calibration data or None, the verification samples). When the build calibrates on a large enough set
    (8 x `checks` or more), its last `checks` samples are held back for verification; a smaller set shares
    up to SHARED_CHECKS x `checks` of its samples, which cost no held-back data; a build without data
    verifies on random inputs. `data.verify_sources` (--verify-data) replace all that: the first `checks` of
    them, and calibration keeps every sample.

    Why more when shared: the kernels-vs-reference rule compares two small errors, and one requantisation
    tie (the reference's float32 sum on one side of half a step, the kernel's exact integer sum on the
    other) grows through the layers of that one sample. On 8 samples a single such sample near a decision
    boundary decides the verdict: PP-OCR's direction classifier, built on 32 text lines with gated
    equalisation, failed on 2.2% of 8-line windows of its 96 lines (0.1% without it) and passed on 16 and
    32 (kernels 0.034 and 0.028 from the reference, tolerances 0.128 and 0.100; avx2, u8u8)."""
    if data.verify_sources:
        given = data.verify_sources if len(data.verify_sources) > 1 else data.verify_sources[0]
        held = load_dataset(given, input_infos_from_graph(graph), spec, count=checks)
        batches = [(b.feeds, b.rows) for b in held.batches(data.batch)]
        source = "--verify-data " + " ".join(Path(p).name for p in data.verify_sources)
        return (load_samples(graph, spec, data) if data.sources else None), Checks(batches, source, len(held))
    if not data.sources:
        return None, random_checks(graph, spec, checks, data.batch)
    dataset = load_samples(graph, spec, data)
    if calibrating and len(dataset) >= 8 * checks:
        dataset, held = dataset.split_tail(checks)
        source = f"the last {checks} calibration samples, held back from calibration"
    else:
        count = min(SHARED_CHECKS * checks, len(dataset))
        held = dataset.head(count)
        shared = "thresholds from the cache" if from_cache else "too few to hold any back"
        source = f"{len(held)} of the {len(dataset)} calibration samples ({shared})"
    batches = [(b.feeds, b.rows) for b in held.batches(data.batch)]
    return dataset, Checks(batches, source, len(held))


def random_checks(graph: gs.Graph, spec: PreprocessSpec | None, count: int, batch: int) -> Checks:
    """Random inputs where no data was given: noise images through the model's preprocessing, else
    standard normal floats (zeros for integer inputs). They check the kernels, not the accuracy."""
    from trtopt.data.arrays import has_batch_axis
    from trtopt.data.preprocess import preprocess_images

    rng = np.random.default_rng(0)
    infos = input_infos_from_graph(graph)
    if not has_batch_axis(infos):  # one whole feed (see trtopt.data.arrays); a noise image for a [3, H, W] input
        noise = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)]
        whole = {info.name: preprocess_images(noise, spec)[0] if spec is not None and len(infos) == 1
                 else random_array(rng, [d or 1 for d in info.shape], info.dtype) for info in infos}  # fmt: skip
        source = "1 random feed (no data given: checks the kernels, not accuracy)"
        return Checks([(whole, None)], source, 1, random=True)
    fixed = {info.shape[0] for info in infos if info.shape and isinstance(info.shape[0], int)}
    rows = fixed.pop() if len(fixed) == 1 else min(count, batch)
    feeds: dict[str, Any] = {}
    for info in infos:
        if spec is not None and len(infos) == 1:
            images = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(rows)]
            feeds[info.name] = preprocess_images(images, spec)
            continue
        shape = [rows, *(d if isinstance(d, int) and d > 0 else 1 for d in info.shape[1:])]
        feeds[info.name] = random_array(rng, shape, info.dtype)
    source = f"{rows} random inputs (no data given: checks the kernels, not accuracy)"
    return Checks([(feeds, None)], source, rows, random=True)


def refused_random_inputs(exc: InputsRejected, checks: Checks, graph: gs.Graph) -> TrtoptError:
    """`exc`, or where the model refused the random inputs a build without data checks on (integer inputs
    are zeros: a zero size for `Expand`, zero splits for `SplitToSequence`), an error that says so and how
    to give real ones."""
    integers = [i.name for i in input_infos_from_graph(graph) if not np.issubdtype(i.dtype, np.floating)]
    if not checks.random or not integers:  # random floats of the input's shape: any model should take them
        return exc
    return TrtoptError(
        f"The model refused the random inputs the build checks its plan on (its integer inputs {integers} were "
        f"zeros): {exc.what}",
        fix="Give inputs it accepts with --verify-data (a .npz with one array per input, or .npy for one "
        "input; --int8 builds take them from --calib).",
    )


SHARED_CHECKS = 4  # x `samples`, shared by a calibration set too small to hold any back (data.samples says why)


@dataclass(frozen=True)
class Checks:
    """The samples a build verifies its plan on: (feeds, rows) batches, and where they came from."""

    batches: list[tuple[dict[str, Any], int | None]]  # (feeds, real rows of each output; None: all)
    source: str
    samples: int | None = None  # None: counted from the batches' rows
    random: bool = False  # random inputs, made up where no data was given (trtopt.data.samples.random_checks)
