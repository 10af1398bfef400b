"""Planned changes and steps: what a plugin wants, as plain serializable data."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuned_rl.host import Host, Task

# A change's kind says which host attribute ``target`` names and how values read:
#   file      target is a host path; values are the file's content
#   sched     target is the task; values are "SCHED_FIFO:50"
#   affinity  target is the task; values are CPU lists "0-3"
#   cgroup    target is the hierarchy's mount point; values are cgroup paths "/rl"
KINDS = ("file", "sched", "affinity", "cgroup")


@dataclass(frozen=True)
class Change:
    """One value to change: the same record plans it, journals it and undoes it."""

    kind: str
    target: str
    before: str
    after: str
    task: Task | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown change kind {self.kind!r}")
        if (self.kind == "file") != (self.task is None):
            raise ValueError(f"a {self.kind} change {'needs' if self.task is None else 'takes no'} task")

    def label(self) -> str:
        """What the report shows as the change's target."""
        if self.task is None:
            return self.target
        where = f" in {self.target}" if self.kind == "cgroup" else ""
        return f"{self.task.label()} {self.kind}{where}"

    def read(self, host: Host) -> str:
        """The value the host holds now (raises TaskGone for a vanished task)."""
        if self.kind == "file":
            return host.read(self.target)
        if self.kind == "sched":
            return host.get_sched(self.task)
        if self.kind == "affinity":
            return host.get_affinity(self.task)
        return host.get_cgroup(self.task, self.target)

    def write(self, host: Host, value: str) -> None:
        if self.kind == "file":
            host.write(self.target, value)
        elif self.kind == "sched":
            host.set_sched(self.task, value)
        elif self.kind == "affinity":
            host.set_affinity(self.task, value)
        else:
            host.set_cgroup(self.task, self.target, value)

    def to_dict(self) -> dict:
        data = {"kind": self.kind, "target": self.target, "before": self.before, "after": self.after}
        if self.task is not None:
            data["task"] = {"pid": self.task.pid, "start_time": self.task.start_time, "comm": self.task.comm}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Change":
        task = Task(**data["task"]) if data.get("task") else None
        return cls(data["kind"], data["target"], data["before"], data["after"], task)


@dataclass
class Step:
    """One tuning step a plugin plans: changes kept or reverted together.

    ``skip_reason`` set means the step cannot apply on this host (and has no changes).
    Changes are applied in order and undone in reverse order.
    """

    table: str
    title: str
    changes: list[Change] = field(default_factory=list)
    skip_reason: str | None = None

    @property
    def pending_changes(self) -> list[Change]:
        return [c for c in self.changes if c.before != c.after]
