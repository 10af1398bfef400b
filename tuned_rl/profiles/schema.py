"""Declarations of profile tables: each key's type, range and meaning."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list"}


@dataclass(frozen=True)
class Problem:
    """Something wrong with a profile: the dotted ``key`` ("rt_runtime.cgroup"), and what."""

    key: str
    message: str


@dataclass(frozen=True)
class Key:
    """One key of a table. ``minimum``/``maximum`` bound numbers (and list items)."""

    type: type
    help: str
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple | None = None
    item_type: type | None = None  # for lists

    def check(self, name: str, value: Any) -> list[Problem]:
        if not _is_type(value, self.type):
            return [Problem(name, f"must be {_TYPE_NAMES[self.type]}, not {value!r}")]
        if self.type is list:
            return [p for item in value for p in self._check_item(name, item)]
        return self._check_item(name, value)

    def _check_item(self, name: str, value: Any) -> list[Problem]:
        if self.item_type is not None and self.type is list and not _is_type(value, self.item_type):
            return [Problem(name, f"items must be {_TYPE_NAMES[self.item_type]}, not {value!r}")]
        if self.choices is not None and value not in self.choices:
            return [Problem(name, f"must be one of {', '.join(map(repr, self.choices))}, not {value!r}")]
        if self.minimum is not None and value < self.minimum:
            return [Problem(name, f"{value!r} is below the minimum {self.minimum!r}")]
        if self.maximum is not None and value > self.maximum:
            return [Problem(name, f"{value!r} is above the maximum {self.maximum!r}")]
        return []


@dataclass(frozen=True)
class Table:
    """A profile table a plugin owns: ``[name]`` with ``keys``."""

    name: str
    help: str
    keys: dict[str, Key] = field(default_factory=dict)

    def check(self, values: Any) -> list[Problem]:
        if not isinstance(values, dict):
            return [Problem(self.name, f"must be a table, not {values!r}")]
        known = ", ".join(self.keys) or "none"
        problems = [Problem(f"{self.name}.{k}", f"unknown key (known: {known})")
                    for k in values if k not in self.keys]
        problems += [Problem(f"{self.name}.{k}", "required key is missing")
                     for k, key in self.keys.items() if key.required and k not in values]
        for name, value in values.items():
            if name in self.keys:
                problems += self.keys[name].check(f"{self.name}.{name}", value)
        return problems


def _is_type(value: Any, wanted: type) -> bool:
    if wanted is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if wanted is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, wanted)
