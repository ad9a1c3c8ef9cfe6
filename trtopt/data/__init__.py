"""Data pipeline: read images robustly, preprocess them per a typed spec, and batch calibration data.

Typical use::

    inputs = input_infos_from_graph(graph)
    data = load_dataset("calib_data/", inputs, spec_for_input(inputs[0].shape, inputs[0].dtype, "imagenet"))
    for batch in data.batches(8):
        run(batch.feeds)
"""

from trtopt.data.config import DataConfig, PreprocessConfig
from trtopt.data.dataset import Batch, Dataset, SkippedFile, load_dataset
from trtopt.data.images import IMAGE_EXTENSIONS, UnreadableFileError, read_image, rgb_from_image
from trtopt.data.input_spec import detect_layout, spec_for_input
from trtopt.data.inputs import InputInfo, input_infos_from_graph
from trtopt.data.overrides import PreprocessOverrides
from trtopt.data.preprocess import PRESETS, PreprocessSpec, preprocess_image, preprocess_images

__all__ = [
    "IMAGE_EXTENSIONS",
    "PRESETS",
    "Batch",
    "DataConfig",
    "Dataset",
    "InputInfo",
    "PreprocessConfig",
    "PreprocessOverrides",
    "PreprocessSpec",
    "SkippedFile",
    "UnreadableFileError",
    "detect_layout",
    "input_infos_from_graph",
    "load_dataset",
    "preprocess_image",
    "preprocess_images",
    "read_image",
    "rgb_from_image",
    "spec_for_input",
]
