"""The words reports use for what happened: a step's outcome, a restored change's, a change's state.

Each is a ``str`` Enum: a member compares equal to its word and is written to JSON as it, so the
JSON reports (which Ansible and scripts read) are the words they always were; code names the
member, so a misspelt outcome is an AttributeError, not a silent mismatch.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A member that prints, formats and serialises as its word on every Python (3.11 changed
    ``format()`` of a str Enum to the member's name)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Outcome(Word):
    """What became of a step (apply, watch)."""

    PLANNED = "planned"  # dry run: would change these values
    UNCHANGED = "unchanged"  # every value already as the profile asks
    APPLIED = "applied"  # written and read back, not latency-verified
    KEPT = "kept"  # verified: no regression of the profile's metric
    REVERTED = "reverted"  # verified: a regression; the values are back
    FAILED = "failed"  # the kernel refused a value or it did not read back; undone
    SKIPPED = "skipped"  # cannot apply here, an earlier step failed, or every task it changes exited
    INCONCLUSIVE = "inconclusive"  # neither a regression nor its absence shown


class Restore(Word):
    """What rollback did with one journaled change."""

    RESTORED = "restored"  # written back to the original, read back
    UNCHANGED = "unchanged"  # already the original
    LEFT = "left"  # someone changed it since the apply: theirs is kept (--force restores)
    GONE = "gone"  # its task exited, or its pid is another task's
    FAILED = "failed"  # could not be restored: the record is kept for the next rollback


class State(Word):
    """Whether a journaled change still holds (status)."""

    HOLDS = "holds"  # the applied value
    DRIFTED = "drifted"  # someone changed it since
    GONE = "gone"  # its task exited
    UNREADABLE = "unreadable"  # the value cannot be read (the reason says why)
    INTERRUPTED = "interrupted"  # its step's apply did not finish
    STALE = "stale"  # journaled in an earlier boot
    REFUSED = "refused"  # a journal record that failed its checks; not replayed
