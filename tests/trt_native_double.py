"""The real `tensorrt` Python bindings, with a double only where TensorRT's native code would run.

How a call is checked (the strongest check available without NVIDIA's native libraries):

- The module is NVIDIA's own pybind11 extension (tools/trt_stub_bindings.py fetches it and builds stub
  ``libnvinfer``/``libnvonnxparser``/``libnvinfer_plugin`` that abort when called). Enums, ``Dims``,
  ``ILogger`` subclasses and ``nptype`` are the real ones; only objects that native factories create
  (Builder, INetworkDefinition, IBuilderConfig, OnnxParser, Runtime, ICudaEngine, IExecutionContext, ...)
  are doubles, `NativeDouble`, each tied to its real class.
- Every method call, property write and constructor call on a double is first replayed on the real class in
  a forked child: the real pybind11 function is called with an *uninitialised* instance of the real class
  as ``self`` (``cls.__new__(cls)``; doubles among the arguments become such instances of their classes).
  pybind11 converts every argument against the real overloads (names, keywords, count, types, implicit
  conversions such as tuple -> Dims) before it runs any C++; a mismatch raises ``TypeError`` there. Once
  the arguments are accepted, the C++ body runs: it dereferences the null object (SIGSEGV) or calls a stub
  (SIGABRT, "trtopt stub: native ... called"). So: TypeError = the real API refuses the call; the child
  dying in native code = the real API accepts it. The child never reaches TensorRT (there is none), and
  core dumps are off in it.
- Attribute names are looked up on the real class: a missing name, a method used as a property or a
  property called as a method (it returns the scripted value, which is not callable), a write to a
  read-only property all fail as they would for real.
- What a double returns is scripted by the test and checked against the return type the real signature
  declares (``-> tensorrt.IHostMemory``, ``-> bool``, ``-> list[tensorrt.Dims]``...): a double cannot hand
  back a string where TensorRT gives an enum, or bytes where it gives IHostMemory.

What this cannot check: what TensorRT's native code does with accepted arguments (that needs a GPU with
TensorRT: tests/test_tensorrt_gpu.py).
"""

from __future__ import annotations

import ctypes
import faulthandler
import inspect
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VERSION = "11.4.0.106"
STUB_MARK = "trtopt stub: native TensorRT function"
NATIVE_DEATHS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS}


class BindingMismatch(AssertionError):
    """trtopt did something the real TensorRT bindings refuse (or a double answered what TensorRT cannot)."""


# --- loading the real bindings --------------------------------------------------------------------

_loaded: dict[str, ModuleType] = {}


def bindings_version() -> str:
    return os.environ.get("TRTOPT_TRT_BINDINGS_VERSION", DEFAULT_VERSION)


def skip_or_fail(reason: str) -> None:
    if os.environ.get("TRTOPT_REQUIRE_TRT_BINDINGS") == "1":
        pytest.fail(f"TRTOPT_REQUIRE_TRT_BINDINGS=1 but the real TensorRT bindings are missing: {reason}")
    pytest.skip(f"needs the real TensorRT bindings: {reason}")


def bindings_site(version: str) -> Path:
    """The prepared folder (tools/trt_stub_bindings.py, cached in ~/.cache/trtopt): skips with the reason."""
    tool = ROOT / "tools" / "trt_stub_bindings.py"
    result = subprocess.run(
        [sys.executable, str(tool), "--version", version], capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        skip_or_fail(result.stderr.strip() or f"{tool.name} exited {result.returncode}")
    return Path(result.stdout.split()[1])


def real_tensorrt() -> ModuleType:
    """NVIDIA's `tensorrt` bindings module (imported as `tensorrt_bindings`: the process's own `tensorrt`,
    which detect.py looks for, is left alone). One version per process: pybind11 types register globally."""
    version = bindings_version()
    if version not in _loaded:
        site = str(bindings_site(version))
        sys.path.insert(0, site)
        try:
            import tensorrt_bindings
        finally:
            sys.path.remove(site)
        if tensorrt_bindings.__version__ != version:
            pytest.fail(f"loaded TensorRT bindings {tensorrt_bindings.__version__}, wanted {version}")
        _loaded[version] = tensorrt_bindings
    return _loaded[version]


# --- the fork oracle -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    detail: str  # the TypeError's text, or how native code was reached


_verdicts: dict[Any, Verdict] = {}
_keep_alive: list[Any] = []


def verdict(function: Callable[..., Any], this: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Verdict:
    """Whether the real pybind11 `function` accepts these arguments with `this` (an uninitialised real
    instance, or nothing) as self; doubles among `args` stand for their uninitialised real instances."""
    _keep_alive.append(function)  # pybind11 functions are unhashable: keyed by id, so never freed
    key = (id(function), tuple(_key(a) for a in args), tuple((k, _key(v)) for k, v in sorted(kwargs.items())))
    if key not in _verdicts:
        real_args = ((this,) if this is not None else ()) + tuple(map(_real, args))
        _verdicts[key] = _probe(function, real_args, {k: _real(v) for k, v in kwargs.items()})
    return _verdicts[key]


def _key(value: Any) -> Any:
    """What decides a verdict: the value, or only the class for a double (repr of a real TensorRT object
    would read its null native pointer)."""
    if isinstance(value, NativeDouble):
        return ("double", value.real_class.__name__)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return (type(value), len(value))
    return (type(value).__module__, type(value).__qualname__, repr(value))


def _real(value: Any) -> Any:
    return value.uninitialised if isinstance(value, NativeDouble) else value


def _probe(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Verdict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(read)
        _child(write, function, args, kwargs)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) in NATIVE_DEATHS:
        stub = next((line for line in text.splitlines() if STUB_MARK in line), "")
        how = stub or f"native code ({signal.Signals(os.WTERMSIG(status)).name} on the uninitialised object)"
        return Verdict(True, how)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return Verdict(True, "returned without native code")
    return Verdict(False, text.strip() or f"child status {status}")


def _child(write: int, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    code = 0
    try:
        os.dup2(write, 1)
        os.dup2(write, 2)
        faulthandler.disable()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no core file, even through a pipe
        function(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        os.write(write, f"{type(exc).__name__}: {exc}".encode())
        code = 3
    os._exit(code)


# --- signatures ------------------------------------------------------------------------------------


def declared_returns(trt: ModuleType, function: Any, name: str) -> list[str]:
    """The return types in a pybind11 docstring, one per overload (``name(...) -> T``)."""
    pattern = re.compile(rf"^(?:\d+\. )?{re.escape(name)}\((.*)\) -> (.+)$")
    found = [m.group(2) for m in map(pattern.match, (function.__doc__ or "").splitlines()) if m]
    if not found:
        raise BindingMismatch(f"cannot read the signature of {name} from its docstring")
    return found


def parameters(function: Any, name: str) -> list[list[tuple[str, bool]]]:
    """(name, has a default) of each parameter but self, per overload, from the pybind11 docstring."""
    pattern = re.compile(rf"^(?:\d+\. )?{re.escape(name)}\((.*)\) -> (.+)$")
    overloads = []
    for match in map(pattern.match, (function.__doc__ or "").splitlines()):
        if match:
            text = match.group(1)
            found = list(re.finditer(r"(?:^|, )(\w+): ", text))
            ends = [m.start() for m in found[1:]] + [len(text)]
            params = [(m.group(1), " = " in text[m.end() : end]) for m, end in zip(found, ends, strict=True)]
            overloads.append([p for p in params if p[0] != "self"])
    return overloads


def accepts_parameters(function: Any, name: str, given: list[str]) -> bool:
    """True if some overload takes exactly `given` first, and defaults for the rest."""
    return any(
        [n for n, _ in params[: len(given)]] == given and all(default for _, default in params[len(given) :])
        for params in parameters(function, name)
    )


def conforms(trt: ModuleType, value: Any, declared: str) -> bool:
    declared = declared.strip()
    inner = re.fullmatch(r"(?:typing\.)?(?:list|List)\[(.+)\]", declared)
    if inner:
        return isinstance(value, list) and all(conforms(trt, v, inner.group(1)) for v in value)
    plain = {"int": int, "bool": bool, "str": str, "float": float}
    if declared in plain:
        return type(value) is plain[declared]
    if declared == "None":
        return value is None
    cls_name = {"nvonnxparser::IParserError": "ParserError"}.get(declared, declared.rsplit(".", 1)[-1])
    cls = getattr(trt, cls_name, None)
    if not isinstance(cls, type):
        raise BindingMismatch(f"the checker cannot read the declared type {declared!r}")
    if isinstance(value, NativeDouble):
        return issubclass(value.real_class, cls)
    by_value = hasattr(cls, "__members__") or issubclass(cls, trt.Dims)  # enums and Dims are never null
    return isinstance(value, cls) or (value is None and not by_value)


# --- doubles ---------------------------------------------------------------------------------------


@dataclass
class Boundary:
    """The real module and a log of every call trtopt made through a double: (Class.member, args, kwargs)."""

    trt: ModuleType
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    classes: dict[str, Any] = field(default_factory=dict)  # the real classes, before a test patches factories

    def __post_init__(self) -> None:
        self.classes = {k: v for k, v in vars(self.trt).items() if isinstance(v, type)}

    def double(self, class_name: str, **answers: Any) -> NativeDouble:
        return NativeDouble(self, self.classes[class_name], answers)

    def called(self, member: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The (args, kwargs) of every call of `member` ("Class.method", "Class.prop=", "Class()")."""
        return [(args, kwargs) for name, args, kwargs in self.calls if name == member]

    def factory(self, class_name: str, make: Callable[..., NativeDouble]) -> Callable[..., NativeDouble]:
        """Stands in for ``trt.<class_name>(...)``: the real constructor checks the arguments (it reaches the
        stub's ``create*_INTERNAL``), then `make` returns the double."""
        real = self.classes[class_name]

        def construct(*args: Any, **kwargs: Any) -> NativeDouble:
            self.check(real.__init__, real.__new__(real), f"{class_name}()", args, kwargs)
            self.calls.append((f"{class_name}()", args, kwargs))
            return make(*args, **kwargs)

        return construct

    def check(self, function: Any, this: Any, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Verdict:
        result = verdict(function, this, args, kwargs)
        if not result.accepted:
            raise BindingMismatch(f"TensorRT {self.trt.__version__} refuses {what}: {result.detail}")
        return result


class NativeDouble:
    """Stands in for one object of `real_class` that only native TensorRT could create.

    `answers` maps a method name to a callable (called with the checked arguments) or a constant, and a
    property name to its value. Property writes are checked and then stored, so reads see them."""

    def __init__(self, boundary: Boundary, real_class: type, answers: dict[str, Any]) -> None:
        object.__setattr__(self, "_state", (boundary, real_class, dict(answers)))
        object.__setattr__(self, "uninitialised", real_class.__new__(real_class))

    @property
    def real_class(self) -> type:
        return self._state[1]

    def __repr__(self) -> str:
        return f"<double of tensorrt.{self.real_class.__name__}>"

    def _member(self, name: str) -> Any:
        boundary, cls, _ = self._state
        member = inspect.getattr_static(cls, name, None)
        if member is None:
            version = boundary.trt.__version__
            raise BindingMismatch(f"tensorrt.{cls.__name__} has no attribute {name!r} in TensorRT {version}")
        return member

    def __getattr__(self, name: str) -> Any:
        boundary, cls, answers = self._state
        member = self._member(name)
        if name not in answers:
            raise AssertionError(f"the test gives the double of {cls.__name__} no answer for {name!r}")
        if isinstance(member, property):
            self._check_return(f"{cls.__name__}.{name}", answers[name], member.fget, "")
            boundary.calls.append((f"{cls.__name__}.{name}", (), {}))
            return answers[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            what = f"{cls.__name__}.{name}({_show(args, kwargs)})"
            boundary.check(getattr(cls, name), self.uninitialised, what, args, kwargs)
            boundary.calls.append((f"{cls.__name__}.{name}", args, kwargs))
            answer = answers[name]
            result = answer(*args, **kwargs) if callable(answer) else answer
            self._check_return(what, result, member, name)
            return result

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        boundary, cls, answers = self._state
        member = self._member(name)
        if not isinstance(member, property):
            raise BindingMismatch(f"tensorrt.{cls.__name__}.{name} is a method, not a property: cannot assign it")
        if member.fset is None:
            raise BindingMismatch(f"tensorrt.{cls.__name__}.{name} is read-only")
        boundary.check(member.fset, self.uninitialised, f"{cls.__name__}.{name} = {value!r}", (value,), {})
        boundary.calls.append((f"{cls.__name__}.{name}=", (value,), {}))
        answers[name] = value

    def __bytes__(self) -> bytes:
        """bytes(IHostMemory): allowed only if the real class has the buffer protocol (checked)."""
        boundary, cls, answers = self._state
        boundary.check(memoryview, None, f"bytes(<{cls.__name__}>)", (self,), {})
        return bytes(answers["__bytes__"])

    def _check_return(self, what: str, value: Any, function: Any, name: str) -> None:
        boundary, cls, _ = self._state
        declared = declared_returns(boundary.trt, function, name)
        if not any(conforms(boundary.trt, value, d) for d in declared):
            raise BindingMismatch(f"the double's {what} returned {value!r}; TensorRT returns {' or '.join(declared)}")


def _show(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) if not isinstance(a, bytes) else f"<{len(a)} bytes>" for a in args]
    return ", ".join(parts + [f"{k}={v!r}" for k, v in kwargs.items()])
