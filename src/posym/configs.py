"""Dataclass configs: strict construction from dicts/YAML, dumping and overriding.

Unknown or mistyped keys are a `PosymError` naming the key and the valid ones, so a typo in a
YAML file never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, TypeVar

from posym.errors import PosymError
from posym.io import quote

T = TypeVar("T")


def to_dict(config: Any) -> dict:
    """A dataclass (possibly nested) as a plain dict of JSON/YAML-able values."""
    return dataclasses.asdict(config)


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Check/convert one value against a (simple) type annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except PosymError as exc:
                errors.append(str(exc))
        raise PosymError(errors[0] if errors else f"{where}: bad value {quote(value)}")
    if origin is typing.Literal:
        if value not in args:
            raise PosymError(f"{where} must be one of {', '.join(map(repr, args))}, got {quote(value)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise PosymError(f"{where} must be a list, got {quote(value)}")
        item = args[0] if args else Any
        out = [_coerce(v, item, where) for v in value]
        return tuple(out) if origin is tuple else out
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        return from_dict(annotation, value, where=where)
    if annotation is bool:
        if not isinstance(value, bool):
            raise PosymError(f"{where} must be true or false, got {quote(value)}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PosymError(f"{where} must be an integer, got {quote(value)}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PosymError(f"{where} must be a number, got {quote(value)}")
        if not math.isfinite(value):  # a NaN or infinite lr/eps/... trains to NaN weights or fails deep inside torch
            raise PosymError(f"{where} must be a finite number, got {value}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise PosymError(f"{where} must be a string, got {quote(value)}")
        return value
    return value


def from_dict(cls: type[T], data: dict | None, *, where: str = "config") -> T:
    """Build dataclass `cls` from `data`, rejecting unknown keys and ill-typed values."""
    if data is not None and not isinstance(data, dict):
        raise PosymError(f"{where} must be a mapping, got {quote(data)}")
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise PosymError(f"unknown key {unknown[0]!r} in {where}; valid keys: {', '.join(sorted(fields))}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PosymError(f"{where}: {exc}") from None


def override(config: T, updates: dict, *, where: str = "config") -> T:
    """A copy of `config` with `updates` applied (nested dataclasses accept nested dicts)."""
    merged = to_dict(config)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return from_dict(type(config), merged, where=where)


def from_file_and_flags(cls: type[T], given: dict | None, flags: dict, *, where: str, options: dict[str, str]) -> T:
    """Build dataclass `cls` from a YAML file's fields `given` (`where`: the file) overridden by the
    command-line `flags` (field -> value, None: not given; `options`: field -> its option). An error
    names where the value came from: `FILE.key` for the file's, the option (`--n`) for a flag's, also in
    the checks of `cls.__post_init__` that start with the field's name.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class C:
    ...     n: int = 1
    ...     def __post_init__(self):
    ...         if self.n > 9:
    ...             raise PosymError(f"n {self.n} is more than 9")
    >>> from_file_and_flags(C, {"n": 3}, {"n": 12}, where="c.yaml", options={"n": "--n"})
    Traceback (most recent call last):
    ...
    posym.errors.PosymError: --n 12 is more than 9
    >>> from_file_and_flags(C, {"n": 12}, {"n": None}, where="c.yaml", options={"n": "--n"})
    Traceback (most recent call last):
    ...
    posym.errors.PosymError: c.yaml: n 12 is more than 9
    """
    if given is not None and not isinstance(given, dict):
        raise PosymError(f"{where} must be a mapping, got {quote(given)}")
    given = dict(given or {})
    hints = typing.get_type_hints(cls)
    chosen = {k: _coerce(v, hints[k], options.get(k, k)) for k, v in flags.items() if v is not None}
    try:
        return from_dict(cls, {**given, **chosen}, where=where)
    except PosymError as exc:
        message = str(exc)
        for field in sorted({**given, **chosen}, key=len, reverse=True):
            if message.startswith(f"{field} ") or message.startswith(f"{field}:"):
                named = options.get(field, field) if field in chosen else f"{where}: {field}"
                raise PosymError(named + message[len(field) :]) from None
        raise
