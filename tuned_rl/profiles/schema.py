"""Declarations of profile tables: each key's type, range and meaning, checked before anything runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from tuned_rl.host.cpus import MAX_CPUS, BeyondMaxCpus, format_cpu_list, parse_cpu_list

if TYPE_CHECKING:
    from tuned_rl.host import Host

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
               dict: "a table"}


@dataclass(frozen=True)
class Problem:
    """Something wrong with a profile: the dotted ``key`` ("rt_runtime.cgroup"), and what."""

    key: str
    message: str


class ValueType:
    """A type that takes more than ``isinstance`` to check (a CPU list, a regular expression).

    ``base`` is the TOML type the value must have; ``check`` returns what is wrong
    with it (None if nothing). ``host`` is where the profile will be applied, for
    checks against the host's facts (online CPUs); it may be None.
    """

    base: type = str
    description: str = ""

    def check(self, value: Any, host: "Host | None") -> str | None:
        raise NotImplementedError


class CpuList(ValueType):
    """A CPU list ("0-1,4"), every CPU of it online on the host."""

    description = 'a CPU list such as "0-1,4"'

    def check(self, value, host):
        try:
            cpus = parse_cpu_list(value)
        except BeyondMaxCpus as error:
            return (f"{value[:80]!r} is not a CPU list (such as \"0-1,4\"): it names CPU {error.cpu}, and Linux has "
                    f"at most {MAX_CPUS}")
        except ValueError:
            return f"{value!r} is not a CPU list (such as \"0-1,4\")"
        online = _online_cpus(host)
        if online is not None and not cpus <= online:
            return (f"CPUs {format_cpu_list(cpus - online)} of {value!r} are not online on this host "
                    f"(online: {format_cpu_list(online)})")
        return None


class Regex(ValueType):
    """A Python regular expression."""

    description = "a regular expression"

    def check(self, value, host):
        try:
            re.compile(value)
        except re.error as err:
            return f"{value!r} is not a regular expression: {err}"
        return None


class CgroupPath(ValueType):
    """A cgroup relative to its hierarchy ("rl", "/ray/actors"): not the root, no '..'."""

    description = 'a cgroup path such as "rl" or "/ray/actors"'

    def check(self, value, host):
        parts = value.strip("/").split("/")
        if not value.strip("/") or ".." in parts or "." in parts or "" in parts:
            return f"{value!r} must name a cgroup inside the hierarchy (no '..', not the root)"
        return None


class Map(ValueType):
    """A table of names to values: every value checked as ``values``, every name as ``names``."""

    base = dict

    def __init__(self, values: "Key", names: ValueType | None = None):
        self.values, self.names = values, names
        self.description = f"a table of names to {_describe(values.type)}"

    def check(self, value, host):
        for name, item in value.items():
            if self.names is not None and (message := self.names.check(name, host)):
                return f"name {name!r}: {message}"
            problems = self.values.check(name, item, host)
            if problems:
                return f"{name!r}: {problems[0].message}"
        return None


TypeSpec = Union[type, ValueType, tuple]


@dataclass(frozen=True)
class Key:
    """One key of a table. ``type`` is a Python type, a tuple of them (any of), or a ValueType;
    ``minimum``/``maximum`` bound numbers (and list items)."""

    type: TypeSpec
    help: str
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple | None = None
    item_type: TypeSpec | None = None  # for lists

    def check(self, name: str, value: Any, host: "Host | None" = None) -> list[Problem]:
        message = _type_problem(value, self.type, host)
        if message:
            return [Problem(name, message)]
        if self.type is list:
            return [p for item in value for p in self._check_item(name, item, host)]
        return self._check_item(name, value, host)

    def _check_item(self, name: str, value: Any, host) -> list[Problem]:
        if self.item_type is not None and self.type is list:
            message = _type_problem(value, self.item_type, host)
            if message:
                return [Problem(name, "items " + message)]
        if self.choices is not None and value not in self.choices:
            return [Problem(name, f"must be one of {', '.join(map(repr, self.choices))}, not {value!r}")]
        if self.minimum is not None and value < self.minimum:
            return [Problem(name, f"{value!r} is below the minimum {self.minimum!r}")]
        if self.maximum is not None and value > self.maximum:
            return [Problem(name, f"{value!r} is above the maximum {self.maximum!r}")]
        return []


@dataclass(frozen=True)
class Table:
    """A profile table a plugin owns: ``[name]`` with ``keys``.

    ``phase`` (tuned_rl.core.phases) says when its steps run. ``any_key``, if set,
    checks every key the table does not declare: a table that is a map itself
    (``[sysctl]``: ``"vm.swappiness" = 10``).
    """

    name: str
    help: str
    keys: dict[str, Key] = field(default_factory=dict)
    phase: str | None = None
    any_key: Key | None = None

    def check(self, values: Any, host: "Host | None" = None) -> list[Problem]:
        if not isinstance(values, dict):
            return [Problem(self.name, f"must be a table, not {values!r}")]
        known = ", ".join(self.keys) or "none"
        problems = [Problem(f"{self.name}.{k}", f"unknown key (known: {known})")
                    for k in values if k not in self.keys and self.any_key is None]
        problems += [Problem(f"{self.name}.{k}", "required key is missing")
                     for k, key in self.keys.items() if key.required and k not in values]
        for name, value in values.items():
            key = self.keys.get(name, self.any_key)
            if key is not None:
                problems += key.check(f"{self.name}.{name}", value, host)
        return problems


def _type_problem(value: Any, wanted: TypeSpec, host) -> str | None:
    options = wanted if isinstance(wanted, tuple) else (wanted,)
    for option in options:
        base = option.base if isinstance(option, ValueType) else option
        if _is_type(value, base):
            return option.check(value, host) if isinstance(option, ValueType) else None
    return f"must be {_describe(wanted)}, not {value!r}"


def _describe(wanted: TypeSpec) -> str:
    options = wanted if isinstance(wanted, tuple) else (wanted,)
    return " or ".join(o.description if isinstance(o, ValueType) else _TYPE_NAMES[o] for o in options)


def _is_type(value: Any, wanted: type) -> bool:
    if wanted is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if wanted is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, wanted)


def _online_cpus(host) -> set[int] | None:
    if host is None:
        return None
    try:
        return host.online_cpus()
    except (OSError, ValueError):
        return None  # a host that does not say: the plan will
