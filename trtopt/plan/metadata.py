"""A plan's metadata: a typed, versioned record of what its build did (`Plan.metadata`).

In the header it is one flat JSON object (the keys below, plus `metadata_version`), so a reader keeps
working field by field. Versions:

- 1: trtopt 0.1.0, no `metadata_version` key; the same keys as version 2.
- 2: `metadata_version` added; read and written as the dataclasses below.

Keys this reader does not know (a later minor addition) are kept in `extra` and written back. A version
newer than `METADATA_VERSION` is refused with what to do: its known keys may mean something else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trtopt.errors import PlanError

if TYPE_CHECKING:
    from trtopt.passes import OptimizeResult
    from trtopt.plan.verification import Verification

METADATA_VERSION = 2
_QUANT_KEYS = ("calibration", "thresholds", "int8_layers", "float_layers", "bias_corrected_layers", "threshold_methods",
               "sensitivity")
_KEYS = ("metadata_version", "source_model", "preprocess", "labels", "precision", "optimizer", "verification",
         "profiles", "sparsity")


@dataclass(frozen=True)
class OptimizerRecord:
    """What the graph passes did (`trtopt compare --per-layer` replays `passes`)."""

    passes: tuple[str, ...]
    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    nodes: tuple[int, int] = (0, 0)  # before, after
    launches_saved: int = 0
    intermediate_bytes_saved: int = 0
    fusion_groups: int = 0

    @classmethod
    def from_result(cls, result: OptimizeResult) -> OptimizerRecord:
        return cls.from_dict(result.to_dict(details=False))  # the optimiser's one report format

    def to_dict(self) -> dict[str, Any]:
        return {"passes": list(self.passes), "changes": self.changes, "nodes": list(self.nodes),
                "launches_saved": self.launches_saved, "intermediate_bytes_saved": self.intermediate_bytes_saved,
                "fusion_groups": self.fusion_groups}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizerRecord:
        before, after = data.get("nodes", (0, 0))
        return cls(
            passes=tuple(str(p) for p in data["passes"]),
            changes={str(k): {str(c): int(n) for c, n in v.items()} for k, v in data.get("changes", {}).items()},
            nodes=(int(before), int(after)),
            launches_saved=int(data.get("launches_saved", 0)),
            intermediate_bytes_saved=int(data.get("intermediate_bytes_saved", 0)),
            fusion_groups=int(data.get("fusion_groups", 0)),
        )


@dataclass(frozen=True)
class QuantRecord:
    """What INT8 quantisation did: the calibration used, each quantised tensor's threshold, and which
    layers run INT8, which stay float (and why), and which had their bias corrected."""

    method: str
    samples: int | None
    thresholds: dict[str, float]
    int8_layers: tuple[str, ...]
    float_layers: dict[str, str] = field(default_factory=dict)
    bias_corrected_layers: tuple[str, ...] = ()
    method_counts: dict[str, int] = field(default_factory=dict)  # tensors per method (`auto` chooses per tensor)
    threshold_methods: dict[str, str] = field(default_factory=dict)  # tensor -> method, where `auto` chose
    sensitivity: dict[str, Any] | None = None  # layers kept float by measured sensitivity (trtopt.search.sensitivity)

    def to_dict(self) -> dict[str, Any]:
        calibration: dict[str, Any] = {"method": self.method, "samples": self.samples}
        if self.method_counts:
            calibration["methods"] = self.method_counts
        data = {"calibration": calibration, "thresholds": self.thresholds, "int8_layers": list(self.int8_layers),
                "float_layers": self.float_layers,
                "bias_corrected_layers": list(self.bias_corrected_layers)}  # fmt: skip
        if self.threshold_methods:
            data["threshold_methods"] = self.threshold_methods
        if self.sensitivity is not None:
            data["sensitivity"] = self.sensitivity
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantRecord:
        calibration = data["calibration"]
        samples = calibration.get("samples")
        return cls(
            method=str(calibration["method"]),
            samples=int(samples) if samples is not None else None,
            thresholds={str(k): _number(v) for k, v in data.get("thresholds", {}).items()},
            int8_layers=tuple(str(n) for n in data.get("int8_layers", [])),
            float_layers={str(k): str(v) for k, v in data.get("float_layers", {}).items()},
            bias_corrected_layers=tuple(str(n) for n in data.get("bias_corrected_layers", [])),
            method_counts={str(k): int(v) for k, v in calibration.get("methods", {}).items()},
            threshold_methods={str(k): str(v) for k, v in data.get("threshold_methods", {}).items()},
            sensitivity=dict(data["sensitivity"]) if data.get("sensitivity") is not None else None,
        )


@dataclass(frozen=True)
class SparsityRecord:
    """What `build --sparsity` found (`trtopt.analysis.sparsity.sparsity_record`): the layers whose weights are 2:4
    and run INT8 or FP16, 2:4 layers left in FP32, eligible layers that are not 2:4, their MAC shares, and what
    the backend can say about its kernels (`Backend.sparsity_note`)."""

    backend: str
    qualifying_layers: tuple[str, ...]
    qualifying_mac_share: float
    fp32_layers_with_2_4_weights: tuple[str, ...]
    eligible_not_2_4: tuple[str, ...]
    eligible_mac_share: float
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "qualifying_layers": list(self.qualifying_layers),
            "qualifying_mac_share": self.qualifying_mac_share,
            "fp32_layers_with_2_4_weights": list(self.fp32_layers_with_2_4_weights),
            "eligible_not_2_4": list(self.eligible_not_2_4),
            "eligible_mac_share": self.eligible_mac_share,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SparsityRecord:
        return cls(
            backend=str(data["backend"]),
            qualifying_layers=_names(data["qualifying_layers"]),
            qualifying_mac_share=_share(data["qualifying_mac_share"]),
            fp32_layers_with_2_4_weights=_names(data["fp32_layers_with_2_4_weights"]),
            eligible_not_2_4=_names(data["eligible_not_2_4"]),
            eligible_mac_share=_share(data["eligible_mac_share"]),
            note=str(data.get("note", "")),
        )


@dataclass(frozen=True)
class PlanMetadata:
    """Everything a plan says about itself besides its I/O and sections. None: not recorded.

    `preprocess` is a `trtopt.data.PreprocessSpec` in its dict form (`PreprocessSpec.from_dict` reads it);
    `quant` is there for INT8 plans; `verification` for plans built since trtopt verified its plans."""

    source_model: str | None = None
    precision: str | None = None  # "int8" or "fp32", "+fp16" where the float regions are FP16
    preprocess: dict[str, Any] | None = None
    labels: tuple[str, ...] | None = None
    optimizer: OptimizerRecord | None = None
    quant: QuantRecord | None = None
    verification: Verification | None = None
    # TensorRT plans: {input: {"min"|"opt"|"max": dims}}, the batch limit `trtopt export --triton` reads.
    profiles: dict[str, dict[str, list[int]]] | None = None
    sparsity: SparsityRecord | None = None  # `build --sparsity`: which layers' weights are 2:4 (analysis.sparsity)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as read

    # A read-only view of the header's JSON keys, for code written against the untyped metadata of 0.1.
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    @property
    def int8(self) -> bool:
        return self.quant is not None

    def to_dict(self) -> dict[str, Any]:
        data = {
            **self.extra,
            "metadata_version": METADATA_VERSION,
            "source_model": self.source_model,
            "preprocess": self.preprocess,
            "labels": list(self.labels) if self.labels is not None else None,
            "precision": self.precision,
            "optimizer": self.optimizer.to_dict() if self.optimizer else None,
        }
        if self.quant is not None:
            data.update(self.quant.to_dict())
        if self.verification is not None:
            data["verification"] = self.verification.to_dict()
        if self.profiles is not None:
            data["profiles"] = self.profiles
        if self.sparsity is not None:
            data["sparsity"] = self.sparsity.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "the plan") -> PlanMetadata:
        """Read any version up to `METADATA_VERSION`; `PlanError` for a newer one or a malformed record."""
        from trtopt.plan.verification import Verification

        check_metadata_version(data.get("metadata_version", 1), where)
        quant = data.get("calibration") is not None  # trtopt writes the five quantisation keys together
        known = _KEYS + (_QUANT_KEYS if quant else ())  # without a calibration record the others are kept as read
        try:
            labels, optimizer = data.get("labels"), data.get("optimizer")
            return cls(
                source_model=_optional_str(data.get("source_model")),
                precision=_optional_str(data.get("precision")),
                preprocess=dict(data["preprocess"]) if data.get("preprocess") is not None else None,
                labels=tuple(str(x) for x in labels) if labels is not None else None,
                optimizer=OptimizerRecord.from_dict(optimizer) if optimizer else None,
                quant=QuantRecord.from_dict(data) if quant else None,
                verification=Verification.from_dict(data["verification"]) if data.get("verification") else None,
                profiles=_profiles(data.get("profiles")),
                sparsity=SparsityRecord.from_dict(data["sparsity"]) if data.get("sparsity") is not None else None,
                extra={k: v for k, v in data.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(
                f"{where} has malformed metadata ({type(exc).__name__}: {exc}).",
                fix="Rebuild the plan with `trtopt build`; plans edited by hand or by other tools are refused.",
            ) from None


def check_metadata_version(version: Any, where: str) -> None:
    """`PlanError` unless `version` is one this reader knows (1 .. METADATA_VERSION)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PlanError(
            f"{where} has metadata_version {version!r}; expected a whole number from 1.",
            fix="Rebuild the plan with `trtopt build`; plans edited by hand or by other tools are refused.",
        )
    if version > METADATA_VERSION:
        from trtopt._version import __version__

        raise PlanError(
            f"{where} has plan metadata version {version}, written by a newer trtopt; this trtopt ({__version__}) "
            f"reads versions 1 to {METADATA_VERSION}.",
            fix="Upgrade trtopt (pip install -U trtopt) to load it, or rebuild the plan with this version.",
        )


def _profiles(value: Any) -> dict[str, dict[str, list[int]]] | None:
    if value is None:
        return None
    return {str(name): {str(k): [int(d) for d in dims] for k, dims in p.items()} for name, p in value.items()}


def _names(value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"not a list of names: {value!r}")
    return tuple(value)


def _share(value: Any) -> float:
    share = _number(value)
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"not a share between 0 and 1: {value!r}")
    return share


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(value: Any) -> float:
    number = float(value)
    if isinstance(value, bool) or not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number
