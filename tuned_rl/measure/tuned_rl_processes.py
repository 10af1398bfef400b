"""The one rule for "is this process tuned-rl?", in its three parts; each caller names the part it needs.

- :func:`runs_tuned_rl`: its command line runs tuned-rl (``tuned-rl ...``, ``python3 -m tuned_rl.cli
  ...``). Any user can make a command line say so, so this only ever keeps a process *out* of
  something: a `tuned-rl measure --target name:X` holds X, but is never part of the target X.
- :func:`runs_tuned_rl_as_root`: the same, run by root: what a root-owned trace instance's pid must
  still be for the instance to be left in place.
- :func:`family`: this process, its ancestors (the shell or agent that runs it) and its descendants
  (its canary and helpers), by pid, never by command line: what an eviction spares. Below a moved
  root (a test tree) no pid is a task of this kernel, and the family is empty.
"""

from __future__ import annotations

import os

from tuned_rl.host import Host, ProcessInfo


def runs_tuned_rl(cmdline: str) -> bool:
    """Whether a command line runs tuned-rl (its first words, not a substring anywhere)."""
    words = cmdline.split(" ", 3) + ["", ""]
    if os.path.basename(words[0]) == "tuned-rl":
        return True
    return os.path.basename(words[0]).startswith("python") and (
        os.path.basename(words[1]) == "tuned-rl" or words[1:3] == ["-m", "tuned_rl.cli"])


def runs_tuned_rl_as_root(process: ProcessInfo) -> bool:
    return runs_tuned_rl(process.cmdline) and bool(process.uids) and process.uids[0] == 0


def is_this_process(host: Host, pid: int) -> bool:
    return pid == host.own_pid()


def ancestors(host: Host) -> set[int]:
    """This process and the processes above it (pid 1 left out)."""
    pids, pid = set(), host.own_pid()
    while pid is not None and pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = host.process(pid).ppid
        except LookupError:
            break
    return pids


def family(host: Host, processes: list[ProcessInfo]) -> set[int]:
    """:func:`ancestors` and every descendant of this process among ``processes``."""
    own = host.own_pid()
    if own is None:
        return set()
    pids = ancestors(host)
    children: dict[int, list[int]] = {}
    for process in processes:
        children.setdefault(process.ppid, []).append(process.pid)
    below = [own]
    while below:
        for child in children.get(below.pop(), []):
            if child not in pids:
                pids.add(child)
                below.append(child)
    return pids


def in_family(host: Host, process: ProcessInfo) -> bool:
    """Whether one process is in :func:`family`, walking up from it (no read of every process)."""
    own = host.own_pid()
    if own is None:
        return False
    pid, steps = process.pid, 0
    while pid > 1 and steps < 64:
        if pid == own:
            return True
        try:
            pid = host.process(pid).ppid
        except LookupError:
            return False
        steps += 1
    return process.pid in ancestors(host)
