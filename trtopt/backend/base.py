"""The backend contract: every decision that depends on where a plan runs, behind one object per backend.

A backend is a `Backend` registered by name in `trtopt.backend.BACKENDS`, where it is defined
(`trtopt/backend/<name>/backend.py`). It owns:

- **status**: whether it can run here, and if not, what is missing (`status`, `install_hint`);
- **quantisation defaults**: what its INT8 kernels need from Q/DQ placement (`quant_config`);
- **options**: its own typed options (`options_type`), their CLI flags, and the settings a build passes it,
  resolved from the build config and the graph (`options`);
- **build**: the plan sections, and the variants to try until one verifies (`build`, `variants`), and the
  form of a plan whose float-math run computes what the built plan computes (`measured_form`: what the
  sensitivity search measures, `trtopt.search.sensitivity`);
- **verification policy**: whether a plan whose kernels miss the tolerance is refused (`strict_verification`);
- **what it says about its kernels**: which quantisation of other tools it keeps (`prequantized_keeps`), and
  what 2:4 sparsity does on it (`sparsity_note`);
- **report**: what it made of the plan, for the build summary (`report`: kernels on the CPU, profiles on
  TensorRT), and its time against FP32's where it can compare them (`speed`);
- **speed choices**: the graph passes it runs by default (`passes`: one that costs on its kernels is left out),
  and the plan it keeps where the verified plan runs slower than FP32 (`faster`: the CPU backend tries INT8
  regions in float and the float plan, issue #45);
- **runner**: executing a plan (`create_runner`);
- **serving**: how Triton Inference Server serves its plans (`triton`: the Triton models its plans export
  to, the default one, the instance kind; `triton_notes`), and whether a plan takes only the shapes of the
  optimisation profiles it records (`profiled`).

`trtopt.build` calls only these; it names no backend. Heavy libraries (ONNX Runtime, TensorRT, CUDA) are
imported inside the methods, so every backend object can be constructed, asked for its status and
listed in `--help` where its library is missing.

The file roles follow Polygraphy's backends (NVIDIA/TensorRT, tools/Polygraphy/polygraphy/backend/<name>/
{loader,runner}.py): our `builder.py` plays the loader's part and `runner.py` the runner's; as Polygraphy's
`BaseRunner.infer` validates inputs once before `infer_impl`, `trtopt.Engine` validates them before any
runner sees them.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from trtopt.plan import Plan
    from trtopt.plan.verification import Verification
    from trtopt.quant import QuantConfig
    from trtopt.quant.thin import Wider

Shape = tuple[int, ...]
BuildSettings = TypeVar("BuildSettings")  # what a backend's `options` resolves and its `build` takes
Sections = dict[str, bytes]  # plan section name -> bytes
Versions = dict[str, str]  # library -> version that built the plan


@dataclass(frozen=True)
class Profile:
    """The shapes one input may take at run time (TensorRT optimisation profile; CPU ignores it)."""

    min: Shape
    opt: Shape
    max: Shape


@dataclass(frozen=True)
class RunOptions:
    """How a runner executes. None means the backend's default."""

    threads: int | None = None
    cuda_graph: bool = False
    device: int = 0
    spin: bool = True  # CPU backend: ONNX Runtime's intra-op threads busy-wait between runs (its default)


@dataclass(frozen=True)
class TritonModel:
    """One kind of Triton model (`trtopt export --triton`): the Triton backend's name (`--triton-backend`),
    the config key and value that name it (`platform: "tensorrt_plan"`, `backend: "python"`), the file its
    backend loads from the version folder, the plan section written as that file (None: the Python model,
    which serves the whole plan), the tensor types it takes, and the config parameter that sets its CPU
    threads (None: it runs on the GPU, and --threads is refused). Sources: trtopt.serving.triton.config."""

    name: str
    key: str
    value: str
    file: str
    section: str | None
    dtypes: frozenset[str]
    threads_parameter: str | None


@dataclass(frozen=True)
class TritonServing:
    """How Triton serves one backend's plans: the Triton models that load its plan's own section
    (`TritonModel.section`; every plan can also go through the Python model), the one `export` writes
    unless told ("python" for the Python model), and the `instance_group` kind (KIND_GPU: instances on every
    GPU; KIND_CPU)."""

    models: tuple[TritonModel, ...] = ()
    default: str = "python"
    instance_kind: str = "KIND_CPU"


@dataclass(frozen=True)
class BackendStatus:
    available: bool
    reason: str = ""


class Runner(Protocol):
    """Executes one plan. Inputs arrive validated (names, shapes, dtypes) by `trtopt.Engine`.

    `timing` names how `trtopt bench` times a call: "host" (the host clock around `infer`) or a device
    clock, which the runner then measures in `timed_infer(feeds) -> (outputs, milliseconds)`."""

    timing: str

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class BackendOptions:
    """Base of each backend's own typed, frozen options (`Backend.options_type`). `backend` names the
    backend they belong to, so a build config can carry options for several backends at once."""

    backend: ClassVar[str]


Options = TypeVar("Options", bound=BackendOptions)


@dataclass(frozen=True)
class BuildTarget:
    """What a build asks of its backend, and all a backend is told of the build config (`BuildConfig.target`):
    INT8 and FP16, whether to use 2:4 sparse kernels, the input shapes the user fixed (--shapes), and the
    backends' own typed options, at most one per backend (`options_for` picks this backend's)."""

    int8: bool = True
    fp16: bool = False
    sparsity: bool = False
    shapes: Mapping[str, Shape] | None = None
    backend_options: tuple[BackendOptions, ...] = ()

    def options_for(self, kind: type[Options]) -> Options:
        """The options of `kind` (one backend's `options_type`) given for this build, or that backend's defaults."""
        return next((o for o in self.backend_options if isinstance(o, kind)), None) or kind()


class BackendReport(Protocol):
    """What a backend made of a built plan, for the build summary: `key` and `to_dict()` for `--json`,
    `rows()` for the table."""

    key: ClassVar[str]

    def to_dict(self) -> dict[str, Any]: ...

    def rows(self) -> list[tuple[str, str]]: ...


@dataclass(frozen=True)
class SpeedChoice:
    """The plan a backend keeps after timing it against FP32 (`Backend.faster`): the verified plan, its
    verification record, the timing for the summary, the INT8 layers it put back in float because their INT8
    kernels did not pay, and whether it kept the float model's plan instead (INT8 paid nowhere). `wider`: the
    Q/DQ model with thin layers in INT8 (`trtopt.quant.thin`) where the plan is built from it."""

    plan: Plan
    verification: Verification | None
    report: BackendReport | None
    kept_float: tuple[str, ...] = ()
    float_plan: bool = False
    wider: Wider | None = None

    def written(self, first: Plan) -> Plan:
        """The chosen plan with `first`'s metadata, changed where the choice changed what it records: a float
        plan has no quantisation record, thin layers taken into INT8 move to its INT8 layers, and layers put back
        in float move to its float layers."""
        from dataclasses import replace

        meta = replace(first.metadata, verification=self.verification)
        if self.float_plan:
            return replace(self.plan, metadata=replace(meta, precision="fp32", quant=None))
        if self.wider is not None and meta.quant is not None:
            thin = set(self.wider.layers)
            quant = replace(meta.quant, int8_layers=(*meta.quant.int8_layers, *self.wider.layers),
                            float_layers={k: v for k, v in meta.quant.float_layers.items() if k not in thin},
                            thresholds={**meta.quant.thresholds, **self.wider.thresholds},
                            bias_corrected_layers=self.wider.bias_corrected)  # fmt: skip
            meta = replace(meta, quant=quant)
        if self.kept_float and meta.quant is not None:
            kept = set(self.kept_float)
            why = {name: "its INT8 region ran slower than float on this CPU" for name in self.kept_float}
            quant = replace(meta.quant, int8_layers=tuple(n for n in meta.quant.int8_layers if n not in kept),
                            float_layers={**meta.quant.float_layers, **why})  # fmt: skip
            meta = replace(meta, quant=quant)
        return replace(self.plan, metadata=meta)


Rebuild = Callable[["onnx.ModelProto"], "tuple[Plan, Verification | None]"]  # build and verify another model


class Backend(ABC, Generic[BuildSettings]):
    """One backend (see the module docstring). Subclasses set the class attributes and the abstract methods;
    `BuildSettings` is what `options` resolves for one build (the CPU's `CpuOptions`, TensorRT's
    `EngineOptions`)."""

    name: ClassVar[str]
    title: ClassVar[str]  # how messages name it, e.g. "TensorRT"
    options_type: ClassVar[type[BackendOptions]]
    runner_section: ClassVar[str]  # the plan section its runner reads
    install_hint: ClassVar[str] = ""  # how to make it available, for "not available here" errors
    auto_rank: ClassVar[int] = 100  # `--backend auto` takes the available backend of lowest rank
    auto_reason: ClassVar[str] = ""  # why `auto` took it, when it is the first choice
    cpu_runtime: ClassVar[bool] = False  # runs on the host CPU: `auto` times those installed (trtopt.auto_backend)
    # Verification policy (trtopt.verify.build_verified): whether a plan whose kernels miss the tolerance is
    # refused (True) or written with the record and a warning (an instance attribute, so a test can flip it),
    # and how to start the fix when no variant passes.
    strict_verification: bool = True
    mismatch_fix: ClassVar[str] = "Try "
    # What a build without --int8 keeps of a model another tool quantised, as "quantise with ..." advice
    # (trtopt.frontend.prequantized; "": nothing known), and what `build --sparsity` can say about this backend's
    # kernels (trtopt.analysis.sparsity; recorded in the plan beside the qualifying layers).
    prequantized_keeps: ClassVar[str] = ""
    sparsity_note: ClassVar[str] = ""
    # Serving: the Triton models its plans export to, and whether a plan's inputs take only the shapes of the
    # optimisation profiles it records (Plan.metadata.profiles: the batch limit and fixed sizes come from them).
    triton: ClassVar[TritonServing] = TritonServing()
    profiled: ClassVar[bool] = False

    @abstractmethod
    def status(self) -> BackendStatus:
        """Whether this backend can build and run here; `reason` says what was found or what is missing."""

    def quant_config(self, quant: QuantConfig, options: BuildSettings | None = None) -> QuantConfig:
        """The user's quantisation config with what this backend's INT8 kernels need filled in (for a build with
        `options`, what `options` resolved, where given)."""
        return quant

    @abstractmethod
    def options(self, target: BuildTarget, graph: gs.Graph) -> BuildSettings:
        """The settings `build` takes, from what the build asks (`target`: this backend's `options_type` entry in
        `target.backend_options`, or its defaults) and the optimised graph. Raises `TrtoptError` for a
        setting this backend cannot honour, before any slow work."""

    def variants(self, options: BuildSettings) -> list[tuple[str, BuildSettings]]:
        """Ways to build this plan, to try in order until one verifies: (label, options) pairs."""
        return [(self.name, options)]

    @abstractmethod
    def build(self, model: onnx.ModelProto, options: BuildSettings) -> tuple[Sections, Versions]:
        """The plan sections for a quantised (Q/DQ) ONNX model, and the versions of the libraries used."""

    def measured_form(self, model: onnx.ModelProto, options: BuildSettings) -> onnx.ModelProto:
        """The Q/DQ model `build` would build, in the form whose run by ONNX Runtime with optimisations off
        (Q/DQ as float math) computes on the same grids as the built plan: what the sensitivity search
        measures each trial plan in. The model itself by default (the plan's kernels read TensorRT's Q/DQ);
        a backend that rewrites the Q/DQ graph before its kernels see it returns that rewrite, which must
        be a pure function of the model (the trials match tensors by content, `trtopt.search._trials`)."""
        return model

    def machine(self) -> str:
        """Where this backend's kernels ran, for messages ("this avx2 CPU")."""
        return f"the {self.name} backend"

    def profiles(self, options: BuildSettings) -> Mapping[str, Profile] | None:
        """The input shapes the plan accepts at run time where the backend fixes them (None: those it was built for)."""
        return None

    def report(self, plan: Plan, options: BuildSettings) -> BackendReport | None:
        """What this backend made of the plan, for the build summary (None: nothing to say)."""
        return None

    def speed(self, plan: Plan, fp32: onnx.ModelProto, feeds: Mapping[str, Any]) -> BackendReport | None:
        """How fast `plan` runs against `fp32` on `feeds` (one batch of the check samples), for the build
        summary; None (the default) where the two cannot be compared on one machine."""
        return None

    def faster(
        self, plan: Plan, options: BuildSettings, verification: Verification | None, model: onnx.ModelProto,
        fp32: onnx.ModelProto, feeds: Mapping[str, Any], rebuild: Rebuild, wider: Wider | None = None,
    ) -> SpeedChoice:  # fmt: skip
        """The plan to write: `plan` (verified, built from the Q/DQ `model`) or another this backend built with
        `rebuild` (which verifies as the first build did; raises `TrtoptError` where no variant passes): a cheaper
        one because `plan` ran slower than `fp32` on `feeds`, or the one of `wider` (the Q/DQ model with thin layers
        in INT8 too, where the build made it) because it ran faster (`options`: what `options` resolved). By
        default `plan`, with `speed`'s figure."""
        return SpeedChoice(plan, verification, self.speed(plan, fp32, feeds))

    def passes(self, chosen: Sequence[str] | None) -> tuple[str, ...] | None:
        """The graph passes a build runs for this backend: the user's list (`GraphConfig.passes`) as given, or
        for None (the default list) this backend's default, which may leave out passes that cost on its kernels."""
        return None if chosen is None else tuple(chosen)

    def triton_notes(self, plan: Plan, model: TritonModel) -> list[str]:
        """What a user must know to serve `plan` as `model` in Triton (none by default)."""
        return []

    @abstractmethod
    def create_runner(self, plan: Plan, options: RunOptions) -> Runner:
        """A runner for `plan`; called once per `Engine` (status already checked)."""

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:  # noqa: B027 (optional, empty by default)
        """This backend's `trtopt build` flags (none by default)."""

    def options_from_args(self, args: argparse.Namespace) -> BackendOptions:
        """This backend's options from its `trtopt build` flags."""
        return self.options_type()
