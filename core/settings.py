"""One way to declare a config field, parse it from text, check it and document it.

A field is declared once, with its default, its meaning and its bounds or choices::

    lr: float = setting(1e-4, "Peak learning rate.", bounds=Bounds(0, low_open=True))
    mode: str = setting("sampled", "sampled or exact.", choices=("sampled", "exact"))

The trainer's ``Config`` sections (``dfpo.trainer.config``), the toy's ``ToyConfig`` (``dfpo.toy.config``)
and the objective overrides (``ObjectiveSpec``, whose richer ``FieldInfo`` uses this module's ``Bounds``) all
go through the same four functions:

- ``parse_value(key, text, type_)``: command-line text to the field's declared type, the one grammar of
  ``dfpo train --set``, ``dfpo toy --override`` / ``--task-opt`` and objective labels (``gspo:eps_low=0.2``);
- ``check_type(key, value, type_)``: a value (read from TOML, or built in Python) of the declared type;
- ``check_value(key, value, setting)`` / ``check_bounds``: inside the declared bounds or choices;
- ``markdown_table(cls)``: the reference rows (key, type, default, allowed values, meaning); ``dfpo.commands.config_reference()``
  writes the whole of docs/config.md's generated block from them.

Every error is a ``ValueError`` that names the key and the bad value. Standard library only (no numpy, no
torch), so the command line stays light.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import tomllib
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

META_KEY = "setting"
"""The key of a field's ``Setting`` in ``dataclasses.Field.metadata``."""


def _number(x: float) -> str:
    """A number as people write it: whole numbers in full (4294967295, not 4.29497e+09), others in %g."""
    return str(int(x)) if isinstance(x, (int, float)) and math.isfinite(x) and float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class Bounds:
    """The interval a number must lie in: [low, high], either end open (``low_open`` / ``high_open``).

    ``low`` or ``high`` may name another field of the same object (``cov_clip_high >= cov_clip_low``);
    ``resolve`` reads it from the object being checked.
    """

    low: float | str = -math.inf
    high: float | str = math.inf
    low_open: bool = False
    high_open: bool = False

    def resolve(self, obj: object = None) -> tuple[float, float]:
        """(low, high) as numbers, the ends that name a field read from ``obj``."""
        low = getattr(obj, self.low) if isinstance(self.low, str) else self.low
        high = getattr(obj, self.high) if isinstance(self.high, str) else self.high
        return low, high

    def contains(self, value: float, obj: object = None) -> bool:
        low, high = self.resolve(obj)
        return (value > low if self.low_open else value >= low) and (value < high if self.high_open else value <= high)

    def phrase(self, obj: object = None) -> str:
        """What a value must be, as an error message or a reference table says it: '>= 1', 'in [0, 1)', 'finite'."""
        low, high = self.resolve(obj) if obj is not None else (self.low, self.high)
        show = lambda x: x if isinstance(x, str) else _number(x)  # noqa: E731
        if high == math.inf and low == -math.inf:
            return "finite"
        if high == math.inf:
            return f"{'>' if self.low_open else '>='} {show(low)}"
        if low == -math.inf:
            return f"{'<' if self.high_open else '<='} {show(high)}"
        return f"in {'(' if self.low_open else '['}{show(low)}, {show(high)}{')' if self.high_open else ']'}"

    def describe(self) -> str:
        """The interval in brackets, ends that name a field by name: '(0, inf]', '[cov_clip_low, inf]'."""
        low = self.low if isinstance(self.low, str) else f"{self.low:g}"
        high = self.high if isinstance(self.high, str) else f"{self.high:g}"
        return f"{'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


@dataclass(frozen=True)
class Setting:
    """What a field declares beside its default: its meaning, and its bounds or its choices."""

    doc: str
    """One sentence (or a few) saying what the field does; the reference table shows it."""
    bounds: Bounds | None = None
    """Numbers: the interval the value must lie in."""
    choices: Collection[str] | None = None
    """Strings: the allowed values (a registry's keys are read when checking, so later registrations count)."""

    def __post_init__(self) -> None:
        if not self.doc.strip():
            raise ValueError("a setting needs a doc saying what it does")
        if self.bounds is not None and self.choices is not None:
            raise ValueError("a setting has bounds or choices, not both")

    def allowed(self) -> str:
        """The allowed values as the reference shows them ('' for any value of the type)."""
        if self.choices is not None:
            return ", ".join(self.choices)
        return "" if self.bounds is None else self.bounds.phrase()


def setting(
    default: object = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    bounds: Bounds | None = None,
    choices: Collection[str] | None = None,
    **metadata: object,
) -> Any:
    """``dataclasses.field`` with a ``Setting`` (doc, bounds, choices) in its metadata; ``metadata`` adds other keys
    (the toy's command-line flag names, for instance). ``factory`` is the ``default_factory`` of a mutable default."""
    info = Setting(doc=doc, bounds=bounds, choices=choices)
    return dataclasses.field(default=default, default_factory=factory, metadata={META_KEY: info, **metadata})


def setting_of(f: dataclasses.Field) -> Setting | None:
    """The ``Setting`` a field declares (None for a field without one)."""
    return f.metadata.get(META_KEY)


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotation of every field of ``cls`` (``from __future__ import annotations`` leaves strings)."""
    return typing.get_type_hints(cls)


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of ``cls`` (a string literal right after a field), read from its source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_doc(cls: type, name: str) -> str:
    """What field ``name`` of ``cls`` means: its ``Setting`` doc, else its attribute docstring ('' if neither)."""
    for f in dataclasses.fields(cls):
        if f.name == name and setting_of(f) is not None:
            return setting_of(f).doc
    return attribute_docs(cls).get(name, "")


# --- parsing ---------------------------------------------------------------------------------------------------

_NOTHING = object()


def _toml(text: str) -> object:
    """``text`` read as one TOML value (a number, a boolean, a quoted string, an array, an inline table), or _NOTHING."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return _NOTHING


def _members(type_: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed); a union of several other types is untyped (object)."""
    if isinstance(type_, types.UnionType) or typing.get_origin(type_) is typing.Union:
        args = typing.get_args(type_)
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else object), len(rest) < len(args)
    return type_, False


def type_name(type_: Any) -> str:
    """'float', 'int or None', 'list', 'tuple[str, ...]': how messages and the reference name a declared type."""
    base, optional = _members(type_)
    name = base.__name__ if isinstance(base, type) and not typing.get_args(base) else str(base).replace("collections.abc.", "")
    name = name.replace("typing.", "")
    return f"{name} or None" if optional else name


def parse_value(key: str, text: str, type_: Any = object) -> object:
    """The value of ``key=text`` in the declared ``type_``; ValueError naming the key and the text.

    One grammar for every command line (surrounding spaces dropped):

    - bool: ``true`` / ``false`` in any case;
    - int: a decimal integer (``1_000``, ``+3``) or any TOML integer (``0x10``);
    - float: a Python or TOML number (``1e-4``, ``3``, ``.5``, ``inf``; bounds refuse what they must);
    - str: the text as written, or a quoted TOML string (``"Q: {prompt}\\nA:"`` with its escapes);
    - list / tuple: a TOML array (``[0.5, 0.8]``); dict / Mapping: a TOML inline table (``{eps_high = 0.28}``);
    - ``X | None``: ``none`` in any case, else X;
    - untyped (``object``, an unknown key): a bool, an int, a float, a quoted string, an array or a table
      as above when the text is one, else the text itself.
    """
    s = text.strip()
    base, optional = _members(type_)
    if optional and s.lower() == "none":
        return None
    origin = typing.get_origin(base) or base
    if base is bool:
        if s.lower() in ("true", "false"):
            return s.lower() == "true"
    elif base is int:
        try:
            return int(s)
        except ValueError:
            value = _toml(s)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    elif base is float:
        try:
            return float(s)
        except ValueError:
            value = _toml(s)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    elif base is str:
        value = _toml(s) if s[:1] in ("'", '"') else _NOTHING
        return value if isinstance(value, str) else s
    elif isinstance(origin, type) and issubclass(origin, (list, tuple)) and origin is not str:
        value = _toml(s) if s.startswith("[") else _NOTHING
        if isinstance(value, list):
            return tuple(value) if issubclass(origin, tuple) else value
    elif isinstance(origin, type) and issubclass(origin, (dict, Mapping)):
        value = _toml(s) if s.startswith("{") else _NOTHING
        if isinstance(value, dict):
            return value
    else:
        return _untyped(s)
    example = {"bool": " (true or false)", "list": " such as [0.5, 0.8]", "dict": " such as {key = 1}"}
    kind = type_name(type_)
    article = "an" if kind[:1] in "aeiou" else "a"
    raise ValueError(f"{key} takes {article} {kind} value{example.get(kind, '')}, got {key}={text!r}")


def _untyped(s: str) -> object:
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    value = _toml(s) if s[:1] in ("'", '"', "[", "{") else _NOTHING
    return s if value is _NOTHING else value


# --- checking --------------------------------------------------------------------------------------------------


def finite_number(value: object) -> bool:
    """A real number (bool excluded) that is neither NaN nor infinite: the one such check of dfpo (settings' bounds,
    reward weights, the logs the explorer and the probe read back)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_type(key: str, value: object, type_: Any) -> object:
    """``value`` as the declared ``type_`` (an int is accepted, and converted, where a float is declared);
    ValueError naming the key and the value otherwise. Floats must be finite; untyped fields take anything."""
    base, optional = _members(type_)
    if optional and value is None:
        return None
    origin = typing.get_origin(base) or base
    if not isinstance(origin, type) or origin is object:
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if base is int and isinstance(value, bool):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if not isinstance(value, origin):
        raise ValueError(f"{key} must be of type {type_name(type_)}, got {value!r} ({type(value).__name__})")
    if base is float and not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    if base is str:
        check_text(key, value)
    return value


def check_text(key: str, value: str) -> None:
    """ValueError naming the key unless ``value`` is text that can be written as UTF-8: a lone surrogate (from
    bytes that are not UTF-8 on a command line, or an escape such as \\ud800) would fail later, in a tokenizer or a
    file writer, far from the setting."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{key} holds {value!r}, which is not text: character {err.start} is a lone surrogate (bytes that are not UTF-8?); "
            "write it in UTF-8"
        ) from None


def check_bounds(key: str, value: object, bounds: Bounds, obj: object = None) -> None:
    """ValueError naming the key and the value unless ``value`` is a finite number within ``bounds``
    (ends that name a field are read from ``obj``)."""
    if not finite_number(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    if not bounds.contains(value, obj):
        raise ValueError(f"{key} must be {bounds.phrase(obj)}, got {value!r}")


def check_choice(key: str, value: object, choices: Collection[str]) -> None:
    """ValueError naming the key, the allowed values and the value unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}; got {value!r}")


def check_value(key: str, value: object, info: Setting, obj: object = None) -> None:
    """``value`` inside the declared bounds or choices of ``info``; ValueError naming the key and the value."""
    if info.choices is not None:
        check_choice(key, value, info.choices)
    if info.bounds is not None:
        check_bounds(key, value, info.bounds, obj)


_SCALARS = (bool, int, float, str)


def check_fields(obj: object, prefix: str = "") -> None:
    """Every declared field of dataclass ``obj`` (and of the dataclasses it holds, their keys ``section.key``):
    the type of a scalar field (bool, int, float, str), then its bounds or choices. ValueError naming the key."""
    hints = type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            check_fields(value, key + ".")
            continue
        info = setting_of(f)
        if info is None:
            continue
        if _members(hints[f.name])[0] in _SCALARS:
            check_type(key, value, hints[f.name])
        check_value(key, value, info, obj)


# --- the reference ---------------------------------------------------------------------------------------------


def literal(value: object) -> str:
    """A default as a config file writes it: true, 0.0001, "tiny", [0.5, 0.8], {}."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def cell(text: str) -> str:
    """Text safe inside a markdown table cell (pipes escaped, one line)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def rows(cls: type, prefix: str = "") -> list[dict[str, str]]:
    """One row per declared field of ``cls`` (nested dataclasses left out): key, type, default, allowed, meaning."""
    hints = type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            continue
        info = setting_of(f)
        default = _default(f)
        out.append(
            {
                "key": prefix + f.name,
                "type": type_name(hints[f.name]),
                "default": "(required)" if default is dataclasses.MISSING else literal(default),
                "allowed": info.allowed() if info is not None and info.allowed() else ("true, false" if hints[f.name] is bool else ""),
                "meaning": field_doc(cls, f.name),
            }
        )
    return out


def markdown_table(table: list[dict[str, str]], code: tuple[str, ...] = ("key", "default")) -> str:
    """A markdown table of ``rows`` (or any list of equal-keyed dicts); the ``code`` columns in backticks."""
    if not table:
        return ""
    heads = list(table[0])
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for row in table:
        lines.append("| " + " | ".join(f"`{cell(row[h])}`" if h in code and row[h] else cell(row[h]) for h in heads) + " |")
    return "\n".join(lines)
