"""INT8 quantisation: decide where Q/DQ go (placement), insert them (qdq), lower them per backend.

Handlers in `rules.py` only *mark* which inputs of which nodes are quantised; `placement.py` turns the
marks into a `QuantPlan`; one place, `qdq.py`, inserts the nodes (the split ONNX Runtime's quantiser
uses, STYLE.md). Before that, `bias.py` moves the biases of the quantised layers to cancel the mean
output shift their INT8 weights cause (bias correction). The search for the layers INT8 costs too much on is
not here: it runs verified trial plans, so it sits above verification (`trtopt.search`).
"""

from trtopt.quant.config import QuantConfig
from trtopt.quant.placement import QuantPlan, QuantSite, plan_quantization
from trtopt.quant.qdq import QdqReport, insert_qdq

__all__ = ["QdqReport", "QuantConfig", "QuantPlan", "QuantSite", "insert_qdq", "plan_quantization"]
