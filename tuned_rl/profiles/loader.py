"""Loading TOML profiles, following ``[profile] include``, and remembering where each key came from."""

from __future__ import annotations

import os
import stat

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11: the same parser, as its own package
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tuned_rl.profiles.schema import Key, Problem, Table

PROFILE_TABLE = Table(
    "profile",
    "Names the profile and the profiles it builds on.",
    {
        "name": Key(str, "Name shown in reports and `status` (default: the file's stem)."),
        "description": Key(str, "One line for humans."),
        "include": Key(list, "Profiles to load first, relative to this file; this file's keys win.",
                       item_type=str),
    },
)


class ProfileError(Exception):
    """The profile cannot be used; ``messages`` each name a file and a key."""

    def __init__(self, messages: list[str]):
        super().__init__("\n".join(messages))
        self.messages = messages


@dataclass
class Profile:
    """A profile with its includes merged in: tables in the order they first appear."""

    name: str
    path: Path
    tables: dict[str, dict] = field(default_factory=dict)
    origins: dict[str, Path] = field(default_factory=dict)  # "table" or "table.key" -> file

    def get(self, table: str) -> dict | None:
        return self.tables.get(table)

    def digest(self) -> str:
        """A hash of the merged tables: two files that say the same thing have the same digest."""
        import hashlib
        import json
        text = json.dumps(self.tables, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def where(self, dotted_key: str) -> Path:
        """The file that set ``dotted_key`` (or its table), for error messages."""
        while dotted_key:
            if dotted_key in self.origins:
                return self.origins[dotted_key]
            dotted_key = dotted_key.rpartition(".")[0]
        return self.path

    def describe(self, problem: Problem) -> str:
        return f"{self.where(problem.key)}: {problem.key}: {problem.message}"


def load_profile(path: str | Path) -> Profile:
    """Read ``path`` and its includes; raises ProfileError naming the file and key."""
    path = Path(path)
    profile = Profile(name=path.stem, path=path)
    _merge_file(profile, path, chain=())
    own = profile.tables.get("profile", {})
    if isinstance(own.get("name"), str):
        profile.name = own["name"]
    return profile


def _merge_file(profile: Profile, path: Path, chain: tuple[Path, ...]) -> None:
    data = _read_toml(path)
    includes = data.get("profile", {}).get("include", []) if isinstance(data.get("profile"), dict) else []
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ProfileError([f"{path}: profile.include: must be a list of file names, not {includes!r}"])
    for name in includes:
        included = (path.parent / name).resolve()
        if included in chain + (path.resolve(),):
            cycle = " -> ".join(str(p) for p in chain + (path.resolve(), included))
            raise ProfileError([f"{path}: profile.include: include cycle: {cycle}"])
        if not included.is_file():
            raise ProfileError([f"{path}: profile.include: included profile {name!r} not found ({included})"])
        _check_trusted(path, name, included)
        _merge_file(profile, included, chain + (path.resolve(),))
    for table, values in data.items():
        _merge_table(profile, path, table, values)


def _check_trusted(path: Path, name: str, included: Path) -> None:
    """An included profile steers a root apply as much as the one named on the command line, but
    nobody named it there: it must be owned by root (or the user running tuned-rl) and writable by
    nobody else, or whoever can write it chooses what root applies."""
    info = included.stat()
    if info.st_uid not in (0, os.geteuid()):
        raise ProfileError([f"{path}: profile.include: included profile {name!r} ({included}) is owned by uid "
                            f"{info.st_uid}: its owner would choose what tuned-rl applies (fix: chown root, or "
                            "copy it)"])
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ProfileError([f"{path}: profile.include: included profile {name!r} ({included}) is writable by group "
                            f"or others (mode {stat.S_IMODE(info.st_mode):o}) (fix: chmod go-w {included})"])


def _merge_table(profile: Profile, path: Path, table: str, values) -> None:
    profile.origins.setdefault(table, path)
    if not isinstance(values, dict):
        profile.tables[table] = values
        profile.origins[table] = path
        return
    merged = profile.tables.setdefault(table, {})
    if not isinstance(merged, dict):
        merged = profile.tables[table] = {}
    for key, value in values.items():
        if table == "profile" and key == "include":
            continue  # an include list belongs to its own file, not to the merge
        merged[key] = value
        profile.origins[f"{table}.{key}"] = path


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as err:
        raise ProfileError([f"{path}: TOML syntax error: {err}"]) from err
    except UnicodeDecodeError as err:
        raise ProfileError([f"{path}: not a text file in UTF-8 (byte {err.start}), so not a TOML profile"]) from err
    except OSError as err:
        raise ProfileError([f"{path}: cannot read profile: {err.strerror or err}"]) from err
