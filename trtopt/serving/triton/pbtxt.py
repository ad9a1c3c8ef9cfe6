"""Protocol-buffer text format, the language of Triton's `config.pbtxt`, for the subset a model
configuration uses: nested messages, repeated fields, strings, integers, floats, booleans and enum
values, with `#` comments.

A message is a dict; a repeated field is a list (of scalars, written ``dims: [ 3, 224, 224 ]``, or of
messages, written as one ``name { ... }`` block per item); an enum value is an `Enum` (written bare, so
``kind: KIND_GPU``); a string is quoted with C escapes. `dict_from_pbtxt` reads such text back, so an
exporter can check that what it wrote says what it meant. The grammar follows protobuf's text format
specification (https://protobuf.dev/reference/protobuf/textformat-spec/); Triton's own parser is
protobuf's `TextFormat` over `model_config.proto`
(https://github.com/triton-inference-server/common/blob/main/protobuf/model_config.proto).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trtopt.errors import TrtoptError


@dataclass(frozen=True)
class Enum:
    """An enum value such as TYPE_FP32 or KIND_GPU (written without quotes)."""

    name: str

    def __post_init__(self) -> None:
        if not _IDENT.fullmatch(self.name):
            raise ValueError(f"not an enum identifier: {self.name!r}")


class PbtxtError(TrtoptError):
    """Text that is not valid protobuf text format (for the subset read here)."""


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(
    r"""\s+|\#[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')|(?P<num>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)"""
    r"""|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[{}\[\]:,;<>])"""
)
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f",
              "v": "\v", "?": "?"}  # fmt: skip


def pbtxt_from_dict(message: Mapping[str, Any], indent: int = 0) -> str:
    """The text-format form of `message` (see the module docstring for the mapping)."""
    pad = "  " * indent
    lines = []
    for key, value in message.items():
        items = value if isinstance(value, list) else [value]
        if value == [] or value is None:
            continue
        if isinstance(items[0], Mapping):
            for item in items:
                lines.append(f"{pad}{key} {{\n{pbtxt_from_dict(item, indent + 1)}{pad}}}\n")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ {', '.join(_scalar(v) for v in value)} ]\n")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}\n")
    return "".join(lines)


def _scalar(value: Any) -> str:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_escape(c) for c in value) + '"'
    raise TypeError(f"no text-format form for {type(value).__name__}")


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\{ord(char):03o}"
    return char  # text format is UTF-8: other characters stand for themselves


def dict_from_pbtxt(text: str, repeated: frozenset[str] = frozenset(), where: str = "config.pbtxt") -> dict[str, Any]:
    """Parse text format into dicts. Fields named in `repeated` always come back as lists; any other
    field that occurs more than once does too. Raises `PbtxtError` with the line of the first problem."""
    tokens = list(_tokens(text, where))
    parser = _Parser(tokens, repeated, where)
    result = parser.message(closing=None)
    return result


def _tokens(text: str, where: str) -> Iterator[tuple[str, str, int]]:
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            line = text.count("\n", 0, pos) + 1
            raise PbtxtError(f"{where}, line {line}: unexpected character {text[pos]!r}.")
        if match.lastgroup is not None:
            yield match.lastgroup, match.group(match.lastgroup), text.count("\n", 0, pos) + 1
        pos = match.end()


class _Parser:
    def __init__(self, tokens: list[tuple[str, str, int]], repeated: frozenset[str], where: str) -> None:
        self.tokens, self.pos, self.repeated, self.where = tokens, 0, repeated, where

    def fail(self, what: str) -> PbtxtError:
        line = self.tokens[min(self.pos, len(self.tokens) - 1)][2] if self.tokens else 1
        return PbtxtError(f"{self.where}, line {line}: {what}.")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos][:2] if self.pos < len(self.tokens) else None

    def take(self, kind: str | None = None, text: str | None = None) -> str:
        token = self.peek()
        if token is None or (kind and token[0] != kind) or (text and token[1] != text):
            raise self.fail(f"expected {text or kind}, found {token[1] if token else 'the end'}")
        self.pos += 1
        return token[1]

    def message(self, closing: str | None) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        while (token := self.peek()) is not None and token[1] != closing:
            name = self.take("ident")
            colon = self.peek() == ("punct", ":")
            if colon:
                self.pos += 1
            if self.peek() in (("punct", "{"), ("punct", "<")):
                values: list[Any] = [self.block()]
            elif self.peek() == ("punct", "["):  # the colon may be left out before a list of messages
                values = self.list()
            elif not colon:
                raise self.fail(f"expected ':' or '{{' after {name}")
            else:
                values = [self.scalar()]
            self._add(fields, name, values)
            if self.peek() in (("punct", ","), ("punct", ";")):
                self.pos += 1
        if closing is None and self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return fields

    def _add(self, fields: dict[str, Any], name: str, values: list[Any]) -> None:
        if name in fields:
            old = fields[name] if isinstance(fields[name], list) else [fields[name]]
            fields[name] = old + values
        elif name in self.repeated or len(values) != 1 or self.tokens[self.pos - 1][1] == "]":
            fields[name] = values
        else:
            fields[name] = values[0]

    def block(self) -> dict[str, Any]:
        closing = "}" if self.take("punct") == "{" else ">"
        inner = self.message(closing)
        self.take("punct", closing)
        return inner

    def list(self) -> list[Any]:
        self.take("punct", "[")
        values: list[Any] = []
        while self.peek() != ("punct", "]"):
            values.append(self.block() if self.peek() == ("punct", "{") else self.scalar())
            if self.peek() == ("punct", ","):
                self.pos += 1
            elif self.peek() != ("punct", "]"):
                raise self.fail("expected ',' or ']' in a list")
        self.take("punct", "]")
        return values

    def scalar(self) -> Any:
        token = self.peek()
        if token is None:
            raise self.fail("expected a value, found the end")
        kind, text = token
        self.pos += 1
        if kind == "str":
            value = _unquote(text, self)
            while self.peek() is not None and self.peek()[0] == "str":  # type: ignore[index]
                value += _unquote(self.take("str"), self)  # adjacent strings concatenate
            return value
        if kind == "num":
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "ident":
            return {"true": True, "false": False, "True": True, "False": False}.get(text, Enum(text))
        raise self.fail(f"expected a value, found {text!r}")


def _unquote(token: str, parser: _Parser) -> str:
    body, out, i = token[1:-1], bytearray(), 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode()
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _UNESCAPES:
            out += _UNESCAPES[nxt].encode()
            i += 2
        elif nxt in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1 :]).group()  # type: ignore[union-attr]
            out.append(int(digits, 8) & 0xFF)
            i += 1 + len(digits)
        elif nxt in "xX" and re.match(r"[0-9a-fA-F]{1,2}", body[i + 2 :]):
            digits = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2 :]).group()  # type: ignore[union-attr]
            out.append(int(digits, 16))
            i += 2 + len(digits)
        else:
            raise parser.fail(f"unknown escape \\{nxt} in a string")
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise parser.fail("a string that is not UTF-8") from None
