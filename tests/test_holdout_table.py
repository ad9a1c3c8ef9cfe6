"""docs/holdout.md's tables are what tools/holdout_table.py makes from the recorded results in docs/holdout.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import holdout_table  # noqa: E402


def test_the_page_is_what_the_recorded_results_make() -> None:
    assert holdout_table.main(["--check"]) == 0, "run python tools/holdout_table.py"


def test_a_row_per_model_and_per_architecture_with_the_goal_judged_on_the_worst_output() -> None:
    results = json.loads(holdout_table.RESULTS.read_text())
    models = holdout_table.model_rows(results["models"])
    assert len(models) == 2 + len(results["models"])
    made = holdout_table.model_rows([{"model": "m", "source": "s", "task": "t", "build": "built", "figure": "–",
                                      "worst_cosine": [0.995, 0.985], "ort": "–", "round": "1"}])  # fmt: skip
    assert made[2].endswith("| 0.995 / 0.985 | – | **not met** | 1 |")
    exports = {e["architecture"] for e in results["architectures"]}
    assert len(holdout_table.architecture_rows(results["architectures"])) == 2 + len(exports)
