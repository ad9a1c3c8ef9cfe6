"""OpenVINO backend: OpenVINO's CPU plugin running trtopt's Q/DQ graph (``pip install "trtopt[openvino]"``).

File roles as in every backend: ``backend.py`` (the registered object), ``options.py`` (`OpenvinoOptions`:
--ov-form, --ov-streams), ``builder.py`` (Q/DQ ONNX -> plan sections, the compiled model's layer precisions),
``runner.py`` (plan -> outputs). Design notes and measurements: below, filled in as measured.
"""
