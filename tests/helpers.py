"""Test helpers: a temporary host tree shaped like this VM's, running tuned-rl, killing it mid-step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fakes import TreeHost
from tuned_rl.host import Host

CPU_MOUNT = "/sys/fs/cgroup/cpu"
ON_A_TREE = Path(__file__).parent / "tuned_rl_on_a_tree.py"  # the CLI with a TreeHost (tests/fakes.py)
MOUNTS_V1 = f"""\
cgroup {CPU_MOUNT} cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
MOUNTS_V2_ONLY = "cgroup2 /sys/fs/cgroup cgroup2 rw,relatime 0 0\n"


# A process that forks a sleeping child on SIGUSR1 and writes the child's pid to the file named
# by its first argument: "a child forked after the apply" for the kernel tests.
FORKER = """\
import os, signal, sys, time
def fork(*_):
    pid = os.fork()
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    open(sys.argv[1], "w").write(str(pid))
signal.signal(signal.SIGUSR1, fork)
while True:
    time.sleep(1)
"""


def forked_child(process, pid_file: Path, timeout: float = 10) -> int:
    """Make a FORKER process fork, and return its child's pid."""
    process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not pid_file.exists() or not pid_file.read_text():
        if time.monotonic() > deadline:
            raise AssertionError("the forker did not fork")
        time.sleep(0.05)
    return int(pid_file.read_text())


class HostTree:
    """A temporary host root with the files tuned-rl reads and writes."""

    def __init__(self, root: Path):
        self.root = root
        self.host = TreeHost(root)
        self.set("/proc/sys/kernel/random/boot_id", "11111111-2222-3333-4444-555555555555")
        self.set("/proc/sys/kernel/sched_rt_runtime_us", "950000")
        self.set("/proc/sys/kernel/sched_rt_period_us", "1000000")
        self.set("/proc/sys/vm/swappiness", "60")
        self.set("/proc/self/mounts", MOUNTS_V1)
        self.set(f"{CPU_MOUNT}/cpu.rt_runtime_us", "950000")
        self.set(f"{CPU_MOUNT}/cpu.rt_period_us", "1000000")
        self.set("/sys/devices/system/cpu/online", "0-1")

    def set(self, target: str, value: str) -> None:
        path = self.host.path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")

    def get(self, target: str) -> str:
        return self.host.read(target)

    def cgroup(self, name: str, runtime: int = 0, period: int = 1000000) -> str:
        """Make a cpu cgroup (and missing parents, at budget 0); returns its directory."""
        directory = f"{CPU_MOUNT}/{name}"
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = f"{CPU_MOUNT}/{'/'.join(parts[:i])}"
            if not self.host.exists(parent):
                self.cgroup("/".join(parts[:i]))
        self.set(f"{directory}/cpu.rt_runtime_us", str(runtime))
        self.set(f"{directory}/cpu.rt_period_us", str(period))
        return directory

    def add_process(self, pid: int, comm: str, threads: tuple[int, ...] = (), *, ppid: int = 1, uid: int = 0,
                    cmdline: str | None = None, policy: int = 0, rt_priority: int = 0, nice: int = 0,
                    flags: int = 0, affinity: str = "0-1", cgroups: dict[str, str] | None = None,
                    start_time: int = 1000) -> None:
        """Write /proc/<pid> (and /proc/<pid>/task/<tid> for it and each thread) as the kernel would."""
        cgroups = cgroups if cgroups is not None else {"cpu": "/", "cpuset": "/"}
        for tid in (pid, *threads):
            fields = ["0"] * 52
            fields[0], fields[1], fields[2], fields[3] = str(tid), f"({comm})", "S", str(ppid)
            fields[8], fields[18], fields[19] = str(flags), str(nice), str(1 + len(threads))
            fields[21], fields[39], fields[40] = str(start_time + (tid - pid)), str(rt_priority), str(policy)
            status = f"Name:\t{comm}\nTgid:\t{pid}\nPid:\t{tid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n" \
                     f"Cpus_allowed_list:\t{affinity}\n"
            lines = "".join(f"{n}:{key}:{path}\n" for n, (key, path) in enumerate(cgroups.items(), 1))
            # A thread's own /proc/<tid> is hidden from a listing of /proc: only the leader's is written.
            for base in {f"/proc/{pid}/task/{tid}"} | ({f"/proc/{pid}"} if tid == pid else set()):
                self.set(f"{base}/stat", " ".join(fields))
                self.set(f"{base}/status", status)
                self.set(f"{base}/cgroup", lines)
                self.set(f"{base}/comm", comm)
                path = self.host.path(f"{base}/cmdline")
                path.write_bytes(("\0".join((cmdline if cmdline is not None else comm).split()) + "\0").encode()
                                 if cmdline != "" else b"")

    def add_thread(self, pid: int, tid: int, *, policy: int = 0, rt_priority: int = 0, nice: int = 0,
                   start_time: int) -> None:
        """A thread process ``pid`` starts later: its leader's files, with its own id, policy, nice
        and start time."""
        leader, base = f"/proc/{pid}/task/{pid}", f"/proc/{pid}/task/{tid}"
        for name in ("status", "cgroup", "comm", "cmdline"):
            self.host.path(f"{base}/{name}").parent.mkdir(parents=True, exist_ok=True)
            self.host.path(f"{base}/{name}").write_bytes(self.host.path(f"{leader}/{name}").read_bytes())
        fields = self.host.path(f"{leader}/stat").read_text().split(" ")
        fields[0], fields[18], fields[21] = str(tid), str(nice), str(start_time)
        fields[39], fields[40] = str(rt_priority), str(policy)
        self.set(f"{base}/stat", " ".join(fields))
        status = self.host.path(f"{base}/status").read_text().replace(f"Pid:\t{pid}\n", f"Pid:\t{tid}\n")
        self.set(f"{base}/status", status)

    def snapshot(self) -> dict[str, str]:
        """Every file's content: compare before and after to prove nothing changed."""
        return {str(p.relative_to(self.root)): p.read_text().strip() for p in sorted(self.root.rglob("*")) if p.is_file()}


def spawn_cli(*args, root: Path | None, state_dir: Path, env: dict | None = None, **popen) -> subprocess.Popen:
    """Start tuned-rl as its own process (for crash and lock tests)."""
    environment = {**os.environ, "TUNED_RL_STATE_DIR": str(state_dir), **(env or {})}
    if root is not None:
        environment["TUNED_RL_HOST_ROOT"] = str(root)
    command = [sys.executable, str(ON_A_TREE)] if root is not None else [sys.executable, "-m", "tuned_rl.cli"]
    return subprocess.Popen([*command, *map(str, args)], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def run_cli(*args, root: Path | None, state_dir: Path, env: dict | None = None, timeout: float = 60):
    process = spawn_cli(*args, root=root, state_dir=state_dir, env=env)
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def wait_until_stopped(process, timeout: float = 30) -> None:
    """Wait for the child to SIGSTOP itself at its pause point."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status = os.waitpid(process.pid, os.WUNTRACED | os.WNOHANG)
        if pid and os.WIFSTOPPED(status):
            return
        if pid:
            raise AssertionError(f"tuned-rl exited before its pause point: {process.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError("tuned-rl did not reach its pause point")


def kill_at(point: str, *args, root, state_dir) -> None:
    """Run tuned-rl until ``point`` (e.g. "written:2"), then SIGKILL it there."""
    process = spawn_cli(*args, root=root, state_dir=state_dir, env={"TUNED_RL_PAUSE_AT": point})
    wait_until_stopped(process)
    os.kill(process.pid, signal.SIGKILL)
    _, status = os.waitpid(process.pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    process.returncode = -signal.SIGKILL
    process.stdout.close()
    process.stderr.close()


def refuse_writes(monkeypatch, host_class, code: int, refused) -> None:
    """Make ``host_class.write`` fail with OSError ``code`` where ``refused(target, value)`` says so,
    as the kernel refuses a value it will not take."""
    write = host_class.write

    def refusing(self, target, value):
        if refused(target, value):
            raise OSError(code, os.strerror(code), str(self.path(target)))
        return write(self, target, value)

    monkeypatch.setattr(host_class, "write", refusing)


class Hogs:
    """CPU hogs (busy Python loops at nice 0), pinned to ``cpus``: ``with Hogs(4, "0"):``."""

    def __init__(self, count: int, cpus: str | None = None):
        self.count, self.cpus, self.processes = count, cpus, []

    def __enter__(self):
        from tuned_rl.host import parse_cpu_list
        for _ in range(self.count):
            process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            if self.cpus is not None:
                os.sched_setaffinity(process.pid, parse_cpu_list(self.cpus))
            self.processes.append(process)
        return self

    def __exit__(self, *exc):
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait()


class CgroupTreeHost(TreeHost):
    """A tree host whose cgroup files act as the kernel's, for plugins that create cgroups and move tasks.

    ``make_dir`` in a cgroup hierarchy makes a cgroup's files; writing a pid to ``cgroup.procs``
    (or a tid to ``tasks`` / ``cgroup.threads``) moves the task: its /proc/<pid>/cgroup line
    changes, as the kernel's does. Like the kernel, it refuses (EINVAL) to move a task whose
    affinity the kernel fixed, and (ENOSPC) a move into a v1 cpuset without CPUs or memory nodes.
    """

    def make_dir(self, target):
        super().make_dir(target)
        mount = self.cgroup_mount(target) if self._in_cgroups(target) else None
        if mount is None:
            return
        names = {"tasks": "", "cgroup.procs": ""} if mount.version == 1 else {
            "cgroup.procs": "", "cgroup.threads": "", "cpuset.cpus": "", "cpuset.cpus.partition": "member",
            "cpu.weight": "100", "cpu.idle": "0"}
        if mount.version == 1 and "cpuset" in mount.key:
            names.update({"cpuset.cpus": "", "cpuset.mems": ""})
        if mount.version == 1 and "cpu" in mount.key.split(","):
            names["cpu.shares"] = "1024"
            if self.exists(f"{mount.mount_point}/cpu.idle"):  # the kernel has cpu.idle (5.15+)
                names["cpu.idle"] = "0"
        for name, value in names.items():
            self.path(f"{target}/{name}").write_text(value + "\n" if value else "")

    def remove_dir(self, target):
        if self._in_cgroups(target):
            for child in self.path(target).iterdir():
                if child.is_file():
                    child.unlink()
        super().remove_dir(target)

    def write(self, target, value):
        name = target.rsplit("/", 1)[1]
        if name in ("cgroup.procs", "tasks", "cgroup.threads") and self._in_cgroups(target):
            return self._move(target.rsplit("/", 1)[0], int(value), whole_process=name == "cgroup.procs")
        return super().write(target, value)

    def cgroup_tasks(self, directory, threads=True):
        """The tasks whose /proc/<pid>/task/<tid>/cgroup line names ``directory``, as the kernel lists them."""
        from tuned_rl.host.processes import parse_cgroup_file
        mount = self.cgroup_mount(directory)
        relative = "/" + directory[len(mount.mount_point):].strip("/")
        found = []
        for cgroup in sorted(self.path("/proc").glob("[0-9]*/task/[0-9]*/cgroup")):
            pid, tid = int(cgroup.parent.parent.parent.name), int(cgroup.parent.name)
            if parse_cgroup_file(cgroup.read_text()).get(mount.key) == relative and (threads or tid == pid):
                found.append(tid)
        return found

    def _in_cgroups(self, target) -> bool:
        try:
            self.cgroup_mount(target)
            return True
        except LookupError:
            return False

    def _move(self, directory: str, pid: int, whole_process: bool) -> None:
        import errno
        from tuned_rl.host.processes import parse_cgroup_file
        mount = self.cgroup_mount(directory)
        if not self.exists(f"/proc/{pid}/stat"):
            raise ProcessLookupError(errno.ESRCH, "No such process")
        if self.process(pid).fixed_affinity:
            raise OSError(errno.EINVAL, "Invalid argument")
        if mount.version == 1 and "cpuset" in mount.key and not (
                self.read(f"{directory}/cpuset.cpus") and self.read(f"{directory}/cpuset.mems")):
            raise OSError(errno.ENOSPC, "No space left on device")
        relative = "/" + directory[len(mount.mount_point):].strip("/")
        tids = sorted(self.thread_ids(pid)) if whole_process else [pid]
        for tid in tids or [pid]:
            for base in (f"/proc/{pid}/task/{tid}", f"/proc/{tid}") if tid == pid else (f"/proc/{pid}/task/{tid}",):
                if not self.exists(f"{base}/cgroup"):
                    continue
                lines = parse_cgroup_file(self.read(f"{base}/cgroup"))
                lines[mount.key] = relative
                self.path(f"{base}/cgroup").write_text(
                    "".join(f"{n}:{key}:{path}\n" for n, (key, path) in enumerate(lines.items(), 1)))

    # Affinity lives in the tree too (Host's calls act on the live kernel whatever the root).

    def get_affinity(self, task):
        self.check_task(task)
        return self.process(task.pid).affinity

    def set_affinity(self, task, value):
        self.check_task(task)
        for base in self._task_bases(task):
            text = self.read(f"{base}/status")
            lines = [f"Cpus_allowed_list:\t{value}" if line.startswith("Cpus_allowed_list:") else line
                     for line in text.splitlines()]
            self.path(f"{base}/status").write_text("\n".join(lines) + "\n")

    def path(self, target):
        # /proc/<tid> of a thread exists in the kernel's /proc though a listing hides it.
        parts = target.split("/")
        if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and not super().path(f"/proc/{parts[2]}").exists():
            for leader in super().path("/proc").iterdir():
                if leader.name.isdigit() and (leader / "task" / parts[2]).is_dir():
                    return super().path("/".join(["", "proc", leader.name, "task", *parts[2:]]))
        return super().path(target)

    # Policy, nice and I/O class live in the tree's stat files too (and a made-up "ioprio" file).

    def _task_bases(self, task):
        pid = self.process(task.pid).tgid
        return {f"/proc/{pid}/task/{task.pid}"} | ({f"/proc/{pid}"} if pid == task.pid else set())

    def _edit_stat(self, task, edits: dict[int, str]) -> None:
        self.check_task(task)
        for base in self._task_bases(task):
            fields = self.read(f"{base}/stat").split(" ")
            for index, value in edits.items():
                fields[index] = value
            self.path(f"{base}/stat").write_text(" ".join(fields) + "\n")

    def get_sched(self, task):
        self.check_task(task)
        return self.process(task.pid).sched

    def set_sched(self, task, value):
        from tuned_rl.host.processes import POLICY_NAMES
        name, _, priority = value.partition(":")
        number = next(n for n, policy in POLICY_NAMES.items() if policy == name)
        self._edit_stat(task, {39: priority or "0", 40: str(number)})

    def get_nice(self, task):
        self.check_task(task)
        return str(self.process(task.pid).nice)

    def set_nice(self, task, value):
        self._edit_stat(task, {18: str(int(value))})

    def get_io_priority(self, task):
        self.check_task(task)
        path = self.path(f"/proc/{task.pid}/ioprio")
        return path.read_text().strip() if path.exists() else "none:0"

    def set_io_priority(self, task, value):
        self.check_task(task)
        for base in self._task_bases(task):
            if value == "none:0":  # the default: no file, as before anything was set
                self.path(f"{base}/ioprio").unlink(missing_ok=True)
            else:
                self.path(f"{base}/ioprio").write_text(value + "\n")

    def migrate_pages(self, task, old_nodes, new_nodes):
        """Move the pages counted in the tree's numa_maps, as the kernel would (to the first new node)."""
        self.check_task(task)
        lines = []
        for line in self.read(f"/proc/{task.pid}/numa_maps").splitlines():
            fields, moved = line.split(), 0
            kept = []
            for field in fields:
                if field.startswith("N") and "=" in field and int(field[1:].split("=")[0]) in old_nodes:
                    moved += int(field.split("=")[1])
                else:
                    kept.append(field)
            target = min(new_nodes)
            out = []
            for field in kept:
                if field.startswith(f"N{target}="):
                    field, moved = f"N{target}={int(field.split('=')[1]) + moved}", 0
                out.append(field)
            if moved:
                out.append(f"N{target}={moved}")
            lines.append(" ".join(out))
        self.path(f"/proc/{task.pid}/numa_maps").write_text("\n".join(lines) + "\n")
        return 0

    # A segment's shared policy lives in a made-up file of the tree; a bind moves the pages the
    # tree's numa_maps count for mappings of it, and every mapping shows the policy, as the kernel's do.

    SEGMENT_POLICIES = "/run/test-segment-policies.json"
    SEGMENT_OWNERS = "/run/test-segment-owners.json"  # path -> uid (a segment not named is root's)

    def _segment_policies(self) -> dict:
        path = self.path(self.SEGMENT_POLICIES)
        return json.loads(path.read_text()) if path.exists() else {}

    def segment_policy(self, path):
        from tuned_rl.host.shared_memory import SegmentGone, SegmentPolicy, segment_path
        file = self.path(segment_path(path))
        if not file.exists():
            raise SegmentGone(f"{path} was removed")
        info = file.lstat()
        owners = self.path(self.SEGMENT_OWNERS)
        owner = json.loads(owners.read_text()).get(path, 0) if owners.exists() else 0  # root's, unless a test says
        return SegmentPolicy(self._segment_policies().get(path, "default"), info.st_ino, info.st_size, owner)

    def set_segment_policy(self, path, policy, inode):
        from tuned_rl.host.shared_memory import SegmentGone, parse_policy
        if self.segment_policy(path).inode != inode:
            raise SegmentGone(f"{path} is another file now")
        policies = self._segment_policies()
        policies[path] = policy
        self.path(self.SEGMENT_POLICIES).parent.mkdir(parents=True, exist_ok=True)
        self.path(self.SEGMENT_POLICIES).write_text(json.dumps(policies))
        mode, nodes = parse_policy(policy)
        for maps in self.path("/proc").glob("*/numa_maps"):
            lines = []
            for line in maps.read_text().splitlines():
                fields = line.split()
                if f"file={path}" in fields:
                    counts = [f for f in fields[2:] if f.startswith("N") and "=" in f]
                    others = [f for f in fields[2:] if f not in counts]
                    if policy.startswith("bind:"):
                        counts = [f"N{min(nodes)}={sum(int(f.split('=')[1]) for f in counts)}"]
                    fields = [fields[0], policy, *others, *counts]
                lines.append(" ".join(fields))
            maps.write_text("\n".join(lines) + "\n")
