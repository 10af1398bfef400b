"""What `tuned-rl watch` says: its events, each with its text rendering.

``--json`` prints each event as it is emitted (a dict whose ``"event"`` is a WatchEvent, written as
its value); without it, :func:`event_line` makes one line for a person, every string escaped
first. docs/watch.md lists the events (tests/test_docs.py holds the list to this Enum).
"""

from __future__ import annotations

import enum
import time
from typing import Callable

from tuned_rl.host import printable


class WatchEvent(str, enum.Enum):
    """Each kind of event, its value the ``"event"`` field's text."""

    WATCHING = "watching"  # the applied profile is kept in force from now
    SERVING = "serving"  # /metrics is served at the url
    MEASURING = "measuring"  # the target is measured all the time (or why it is not)
    RESCANNED = "rescanned"  # every process was read again
    PLACED = "placed"  # a step written for a process that started after the apply
    EVICTED = "evicted"  # an offline job moved off the latency CPUs (a step whose verb is "evicted")
    INHERITED = "inherited"  # the undo of what a child inherited from a placed parent, journaled
    BACKED_OFF = "backed-off"  # someone moved a process back after watch placed it: it is left alone
    DEFERRED = "deferred"  # the workload started: a step apply deferred is applied, then verified
    VERIFYING = "verifying"  # the workload started: the steps apply could not verify are verified now
    VERIFIED = "verified"  # one such step's verdict
    ALARM = "alarm"  # one wait of the target beyond --alarm-ms, and who held the CPU
    REGRESSED = "regressed"  # the target's p999 over the window beyond the verified figure's limit
    RECOVERED = "recovered"  # back within the limit
    LOST = "lost"  # the kernel dropped process events: a rescan answers them
    FAILED = "failed"  # a plugin raised, or a step could not be written, for one process
    STOPPED = "stopped"  # watch ends (why)

    def __str__(self) -> str:
        return self.value


STEP_VERBS = {WatchEvent.PLACED.value: WatchEvent.PLACED, WatchEvent.EVICTED.value: WatchEvent.EVICTED}


def step_event(verb: str) -> WatchEvent:
    """The event of a step watch wrote, by the verb the step says of itself ("placed" unless it says
    "evicted")."""
    return STEP_VERBS.get(verb, WatchEvent.PLACED)


def event_line(event: dict) -> str:
    """A watch event, timed, as one line for a person (``--json`` prints the event itself). Every text
    in it is escaped first: a process name, a command line or a cgroup is any user's, and the line
    goes to journald (the unit runs watch without --json), where a newline would forge a second one."""
    event = _escaped(event)
    details = describe_event(event) or " ".join(f"{k}={v}" for k, v in event.items() if k not in ("time", "event"))
    return f"{time.strftime('%H:%M:%S', time.localtime(event['time']))} {event['event']}: {details}"


def describe_event(event: dict) -> str | None:
    """One line for a person, for the events whose fields do not read well as key=value (else None)."""
    text = _TEXTS.get(event["event"])
    return text(event) if text is not None else None


def _alarm_text(event: dict) -> str:
    who = "; ".join(_describe_holder(h) for h in event.get("holders", [])) or event.get("holders_note", "")
    suppressed = f" ({event['suppressed']} more suppressed since the last alarm)" if event.get("suppressed") else ""
    return (f"{event['target']} waited {event['wait_us'] / 1000:.1f} ms on CPU {event['cpu']} (tid {event['tid']} "
            f"{event.get('comm', '')}), behind: {who}{suppressed}")


def _regressed_text(event: dict) -> str:
    who = "; ".join(f"{h.get('holder')} {h.get('name', '')} {h.get('share_of_worst_1pct', 0):.0%} of the worst 1%"
                    for h in event.get("holders", [])) or event.get("holders_note", "")
    return (f"{event['target']}: p999 {event['p999_us'] / 1000:.2f} ms over the last {event['window_s']:g} s, "
            f"verified at {event['verified_p999_us'] / 1000:.2f} ms (limit x{event['factor']:g}); top holders: {who}")


# The events whose fields do not read well as key=value; the others are printed as their fields.
_TEXTS: dict[str, Callable[[dict], str]] = {WatchEvent.ALARM.value: _alarm_text,
                                            WatchEvent.REGRESSED.value: _regressed_text}


def _describe_holder(holder: dict) -> str:
    held = f"{holder['held_us'] / 1000:.1f} ms"
    if holder["kind"] == "task":
        return (f"pid {holder['pid']} {holder.get('comm', '')} ({holder.get('policy', '')}, cgroup "
                f"{holder.get('cgroup', '?')}) {held}")
    if holder["kind"] == "irq":
        return f"irq {holder['irq']} {holder.get('name', '')} {held}"
    if holder["kind"] == "softirq":
        return f"softirq {holder['softirq']} {held}"
    return f"{holder['kind']} {held}"


def _escaped(value):
    """``value`` with every string in it (keys too, at any depth) passed through ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(v) for v in value]
    return value
