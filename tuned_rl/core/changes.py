"""Planned changes and steps: what a plugin wants, as plain serializable data."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuned_rl.core.kinds import Kind, Value, kind_named
from tuned_rl.host import Host, Task
from tuned_rl.host.host import ACTIONS


@dataclass(frozen=True, eq=False)
class Change:
    """One value to change: the same record plans it, journals it and undoes it.

    ``kind`` names a registered kind (tuned_rl.core.kinds), which says what ``target``
    is and how values read, write and compare. ``task`` is set for kinds that change a
    task's attribute. ``follow_up`` names an action (``ACTIONS``) run once after the
    step that holds this change is written, and again after it is undone.
    """

    kind: str
    target: str
    before: Value
    after: Value
    task: Task | None = None
    follow_up: str | None = None

    def __post_init__(self):
        handler = kind_named(self.kind)
        if handler.task != (self.task is not None):
            raise ValueError(f"a {self.kind} change {'needs' if handler.task else 'takes no'} task")
        if self.follow_up is not None and self.follow_up not in ACTIONS:
            raise ValueError(f"unknown follow-up action {self.follow_up!r} (known: {', '.join(ACTIONS)})")

    def __eq__(self, other) -> bool:
        return isinstance(other, Change) and self.to_dict() == other.to_dict()

    @property
    def handler(self) -> Kind:
        return kind_named(self.kind)

    @property
    def pending(self) -> bool:
        """The host does not hold ``after`` yet."""
        return not self.handler.same(self.before, self.after)

    def label(self) -> str:
        """What the report shows as the change's target."""
        return self.handler.label(self)

    def read(self, host: Host) -> Value:
        """The value the host holds now (raises TaskGone for a vanished task)."""
        return self.handler.read(host, self)

    def write(self, host: Host, value: Value) -> None:
        self.handler.write(host, self, value)

    def holds(self, value: Value, wanted: Value) -> bool:
        return self.handler.same(value, wanted)

    def identity(self) -> tuple:
        """Which host value this change is about, whatever its values."""
        task = (self.task.pid, self.task.start_time) if self.task else None
        return (self.kind, self.target, task)

    def to_dict(self) -> dict:
        data = {"kind": self.kind, "target": self.target, "before": self.before, "after": self.after}
        if self.task is not None:
            data["task"] = {"pid": self.task.pid, "start_time": self.task.start_time, "comm": self.task.comm}
        if self.follow_up is not None:
            data["follow_up"] = self.follow_up
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Change":
        """A change read back from the journal; raises ValueError if it is not one tuned-rl could have written."""
        if not isinstance(data, dict) or not {"kind", "target", "before", "after"} <= set(data):
            raise ValueError(f"not a change record: {data!r}"[:200])
        task = data.get("task")
        if task is not None:
            if not (isinstance(task, dict) and isinstance(task.get("pid"), int) and task["pid"] > 0
                    and isinstance(task.get("start_time"), int) and isinstance(task.get("comm", ""), str)):
                raise ValueError(f"not a task: {task!r}"[:200])
            task = Task(task["pid"], task["start_time"], task.get("comm", ""))
        change = cls(data["kind"], data["target"], data["before"], data["after"], task, data.get("follow_up"))
        problems = change.handler.check(change)
        if problems:
            raise ValueError(f"{change.kind} change of {data['target']!r}: {'; '.join(problems)}")
        return change


@dataclass
class Step:
    """One tuning step a plugin plans: changes kept or reverted together.

    ``skip_reason`` set means the step cannot apply on this host (and has no changes).
    Changes are applied in order and undone in reverse order. ``notes`` are said in
    the report beside the step (an IRQ the kernel will not move; a task spared).
    """

    table: str
    title: str
    changes: list[Change] = field(default_factory=list)
    skip_reason: str | None = None
    notes: list[str] = field(default_factory=list)
    # Skipped only because the workload has no processes yet: `tuned-rl watch` applies and
    # verifies it when the workload starts.
    waits_for_workload: bool = False
    # What writing the step does to a process, as `tuned-rl watch` says it ("placed"; an eviction's
    # step says "evicted"): watch's events name the step's verb, never its plugin.
    verb: str = "placed"

    @property
    def pending_changes(self) -> list[Change]:
        return [c for c in self.changes if c.pending]
