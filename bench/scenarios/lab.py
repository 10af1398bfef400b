"""The scenario lab's shared pieces: cgroups, load, and running `tuned-rl apply`."""

from __future__ import annotations

import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tuned_rl.diagnose import facts
from tuned_rl.host import Host

HERE = Path(__file__).parent
CPU = Path("/sys/fs/cgroup/cpu")
CPUSET = Path("/sys/fs/cgroup/cpuset")


@dataclass
class Outcome:
    """What one scenario run showed."""

    scenario: str
    decision: str
    before_p999_us: float | None
    after_p999_us: float | None
    seconds: float
    report: dict
    host_restored: bool
    value_after_apply: str | None = None  # what the step's target held when apply finished
    quiet_p999_us: float | None = None  # the target alone, measured in the same run
    differences: list[str] | None = None  # what the rollback did not put back (placement scenarios)
    steal_ms: dict[int, float] | None = None  # per CPU: time the hypervisor ran something else meanwhile
    before_p99_us: float | None = None  # placement scenarios: the p99 the p999 figures stand beside
    after_p99_us: float | None = None
    placement_verdict: dict | None = None  # placement scenarios: the judge's figures for the placement step

    @property
    def measured_seconds(self) -> float | None:
        """The last step's seconds of measurement (None for a step nothing measured)."""
        steps = self.report.get("steps")
        return ((steps[-1].get("verdict") or {}).get("seconds")) if steps else None

    def row(self) -> str:
        def ms(us):
            return "-" if us is None else f"{us / 1000:.2f} ms"
        measured = f"{self.measured_seconds:5.1f} s" if self.measured_seconds is not None else f"{'-':>7}"
        return (f"{self.scenario:<16} {ms(self.before_p999_us):>11} {ms(self.after_p999_us):>11} "
                f"{self.decision:<13} {self.seconds:6.1f} s {measured}  {'yes' if self.host_restored else 'NO'}")


HEADER = f"{'scenario':<16} {'before p999':>11} {'after p999':>11} {'decision':<13} {'time':>8} {'measured':>8}  restored"


@contextmanager
def cgroup(hierarchy: Path, name: str, settings: dict[str, str]):
    """A cgroup with ``settings`` written in order; its tasks are moved out and it is removed after."""
    directory = hierarchy / name
    directory.mkdir()
    try:
        for key, value in settings.items():
            (directory / key).write_text(value)
        yield directory
    finally:
        for tid in (directory / "tasks").read_text().split():
            try:
                (hierarchy / "tasks").write_text(tid)
            except OSError:
                pass  # exited meanwhile
        if (directory / "cpu.rt_runtime_us").exists():
            (directory / "cpu.rt_runtime_us").write_text("0")
        directory.rmdir()


@contextmanager
def processes(commands: list[list[str]], setup=None, kill_children: bool = False):
    """Start ``commands``; ``setup(process)`` places each one; all are killed after (with
    ``kill_children``, each in a session of its own, and its whole process group with it)."""
    started = []
    try:
        for command in commands:
            process = subprocess.Popen(command, start_new_session=kill_children)
            started.append(process)
            if setup:
                setup(process)
        yield started
    finally:
        for process in started if kill_children else []:
            try:
                os.killpg(process.pid, signal.SIGCONT)  # a stopped process ignores SIGKILL until continued
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in started:
            process.terminate()  # SIGTERM first: the workload removes its shared memory
        for process in started:
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def rt_actors(directory: Path):
    """Two SCHED_FIFO:10 actors busy 8 ms of every 10 in the cpu cgroup ``directory``, one per CPU:
    two on one CPU would leave the other CPU's share of the group's budget unthrottled, and a
    FIFO workload in the group would simply run there."""
    cpus = iter(range(os.cpu_count()))

    def place(process):
        os.sched_setaffinity(process.pid, {next(cpus) % os.cpu_count()})
        (directory / "tasks").write_text(str(process.pid))
        os.sched_setscheduler(process.pid, os.SCHED_FIFO, os.sched_param(10))

    with processes([duty_command(8, 10), duty_command(8, 10)], place) as started:
        yield started


OFFLINE_JOB = "tuned-rl-lab-offline-job"  # in every CPU hog's command line: what eviction matches


def hog_command() -> list[str]:
    return [sys.executable, "-c", "while True: pass", OFFLINE_JOB]


def duty_command(busy_ms: float, period_ms: float) -> list[str]:
    """A thread busy ``busy_ms`` of every ``period_ms``: an RT actor doing its work."""
    return [sys.executable, "-c", textwrap.dedent(f"""\
        import time
        while True:
            start = time.monotonic()
            while time.monotonic() - start < {busy_ms / 1000}:
                pass
            time.sleep({(period_ms - busy_ms) / 1000})
        """)]


LAB_PLUGIN = HERE / "lab_plugin"  # the lab's own third-party plugin ([lab_stall]), with its dist-info


def canary_shape(text: str) -> str:
    """``PERIODxTHREADS`` (e.g. ``500x8``, for argparse): the [target] keys of such a canary."""
    import argparse
    period, _, threads = text.partition("x")
    if not (period.isdigit() and threads.isdigit() and int(period) > 0 and int(threads) > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected PERIODxTHREADS, e.g. 500x8")
    return f"canary_period_us = {int(period)}\ncanary_threads = {int(threads)}"


def verify_setting(text: str) -> str:
    """``KEY=NUMBER`` (for argparse, e.g. ``harm=4``): one line of a profile's [verify] table."""
    import argparse
    key, _, value = text.partition("=")
    try:
        number = float(value) if key.isidentifier() else None
    except ValueError:
        number = None
    if number is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=NUMBER, e.g. harm=4")
    return f"{key} = {number!r}"


def add_verify_option(parser) -> None:
    """A scenario's ``--verify KEY=NUMBER ...``: [verify] settings for the profile it applies."""
    parser.add_argument("--verify", nargs="*", type=verify_setting, default=[], metavar="KEY=NUMBER",
                        help="a [verify] setting for the profile, e.g. harm=4")


def verify_table(settings) -> str:
    """A [verify] table of ``verify_setting`` lines, to append to a profile; none for no settings."""
    return "\n[verify]\n" + "\n".join(settings) + "\n" if settings else ""


def apply_profile(text: str, state_dir: Path, timeout: float = 600, lab_plugin: bool = False) -> tuple[dict, float]:
    """Run `tuned-rl apply --json` on a profile; returns the report and the seconds it took.

    ``lab_plugin``: load the lab's own plugin too, as a third-party plugin is loaded (PYTHONPATH).
    """
    profile = state_dir / "profile.toml"
    state_dir.mkdir(parents=True, exist_ok=True)  # the profile is written before tuned-rl runs
    profile.write_text(text)
    started = time.monotonic()
    report = tuned_rl_json(["apply", str(profile)], state_dir, timeout, lab_plugin)
    return report, time.monotonic() - started


def run_tuned_rl(args: list[str], state_dir: Path, timeout: float, lab_plugin: bool = False
                 ) -> subprocess.CompletedProcess:
    """`tuned-rl ARGS` in a new process on this host (never a test tree), with its own state
    directory (made here if missing); RuntimeError if it fails."""
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TUNED_RL_STATE_DIR": str(state_dir)}
    env.pop("TUNED_RL_HOST_ROOT", None)
    if lab_plugin:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LAB_PLUGIN), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "tuned_rl.cli", *args], capture_output=True, text=True, env=env,
                            timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"tuned-rl {args[0]} exited {result.returncode}: {result.stderr[-2000:]}")
    return result


def tuned_rl_json(args: list[str], state_dir: Path, timeout: float, lab_plugin: bool = False) -> dict:
    """What `tuned-rl ARGS --json` printed."""
    return json.loads(run_tuned_rl([*args, "--json"], state_dir, timeout, lab_plugin).stdout)


def rollback(state_dir: Path) -> None:
    run_tuned_rl(["rollback"], state_dir, 120)


def outcome_of(scenario: str, report: dict, seconds: float, restored: bool) -> Outcome:
    step = report["steps"][-1]
    return Outcome(scenario, step["outcome"], (step.get("before") or {}).get("p999_us"),
                   (step.get("after") or {}).get("p999_us"), seconds, report, restored)


def snapshot(paths: list[Path]) -> dict[str, str]:
    return {str(p): p.read_text().strip() for p in paths}


# A quiet p999 here moves by tens of microseconds from one run to the next (0.03-0.08 ms read in
# consecutive runs of the same scenario): a ratio to such a floor alone calls 30 us a failure.
FLOOR_SLACK_US = 50.0


def block_noise(logs: list[float]) -> float:
    """A block's own noise in a series of blocks' log statistics: half the variance of adjacent
    blocks' differences (a drift, which moves neighbours alike, does not count); NaN under 3 blocks."""
    differences = [b - a for a, b in zip(logs, logs[1:])]
    return statistics.variance(differences) / 2 if len(differences) >= 2 else float("nan")


def near_floor(value_us: float, floor_us: float, ratio: float) -> bool:
    """Whether a p999 is within ``ratio`` of a quiet floor measured in the same run, or within
    FLOOR_SLACK_US of it where the floor is a few tens of microseconds."""
    return value_us <= max(ratio * floor_us, floor_us + FLOOR_SLACK_US)


def main_once(run, row=Outcome.row) -> None:
    """A scenario's command line: run it once, print its row, its reason and its JSON report."""
    with tempfile.TemporaryDirectory() as state:
        result = run(Path(state))
    print(HEADER)
    print(row(result))
    print(result.report["steps"][-1]["reason"])
    print(json.dumps(result.report, indent=1))


def main_runs(run, row=Outcome.row, verify: bool = False, canary: bool = False) -> None:
    """``--runs N``: run a scenario N times and tally its decisions (``verify``: the scenario's ``run``
    takes the ``--verify KEY=NUMBER`` settings for its profile's [verify] table too; ``canary``: and
    ``canary=``, the [target] keys of ``--canary PERIODxTHREADS``)."""
    args = runs_arguments(None, verify, canary)
    print(HEADER, flush=True)
    decisions, seconds, measured, held = [], [], [], collections.Counter()
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as state:
            extra = {"canary": args.canary} if canary else {}
            result = run(Path(state), args.verify, **extra) if verify else run(Path(state), **extra)
        decisions.append(result.decision)
        seconds.append(result.seconds)
        measured.append(result.measured_seconds or 0.0)
        print(row(result), flush=True)
        print(f"  {result.report['steps'][-1]['reason']}", flush=True)
        looks = held_back(result.report["steps"][-1])
        if looks:
            print(f"  {held_back_line(looks)}", flush=True)
        held.update(why for _, why in looks)
    print(", ".join(f"{d} {decisions.count(d)}" for d in sorted(set(decisions))) + f" of {args.runs}; median "
          f"{statistics.median(seconds):.1f} s an apply, {statistics.median(measured):.1f} s of it measuring")
    if held:
        print("what held keeps back, over the runs' looks: " + ", ".join(f"{why} {n}" for why, n in held.most_common()))


def runs_arguments(argv: list[str] | None, verify: bool = False, canary: bool = False):
    """``main_runs``' options: ``--runs N``, and (``verify``) ``--verify KEY=NUMBER ...``, (``canary``)
    ``--canary PERIODxTHREADS``, whose absence is "" (no [target] keys: the canary's defaults)."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    if verify:
        add_verify_option(parser)
    if canary:
        # No string default: argparse would pass it through canary_shape, which refuses "".
        parser.add_argument("--canary", type=canary_shape, default=None, metavar="PERIODxTHREADS",
                            help="the canary's wake period (us) and threads, e.g. 250x4 (default: the canary's defaults)")
    args = parser.parse_args(argv)
    if canary and args.canary is None:
        args.canary = ""
    return args


def held_back(step: dict) -> list[tuple[int, str]]:
    """The looks of a verified step at which a keep could be made but was held back, and by what
    (the report's ``keep_held_back``): where its measuring time went."""
    return [(b["block"], b["keep_held_back"]) for b in step.get("blocks") or [] if "keep_held_back" in b]


def held_back_line(looks: list[tuple[int, str]]) -> str:
    """``held_back``'s looks in one line: "held back at the looks after blocks: 6 tail, 7 broad"."""
    return "held back at the looks after blocks: " + ", ".join(f"{block} {why}" for block, why in looks)


def measure(target: str, seconds: float, state_dir: Path) -> dict:
    """`tuned-rl measure --json` of ``target`` ("name:REGEX"): the figures of ``seconds`` of windows."""
    return tuned_rl_json(["measure", "--target", target, "--seconds", str(seconds), "--window-seconds", "0.5"],
                         state_dir, seconds + 120)


def steal_ms() -> dict[int, float]:
    """Per CPU, the steal time /proc/stat has counted since boot, in ms: time a busy virtual CPU
    waited while the hypervisor ran something else (diagnose reads it the same way)."""
    return facts.steal_ms(Host())


def steal_since(start: dict[int, float]) -> dict[int, float]:
    now = steal_ms()
    return {cpu: now[cpu] - start.get(cpu, 0.0) for cpu in now}


def placement() -> dict:
    """Where interrupts, queue work, workqueues and every task may run, and every cpuset: to show a
    rollback put the host's placement back exactly (tasks compared by pid and start time)."""
    found: dict = {"cpusets": sorted(str(p) for p in CPUSET.rglob("*") if p.is_dir())}
    paths = [Path("/proc/irq/default_smp_affinity"), Path("/sys/devices/virtual/workqueue/cpumask"),
             *Path("/proc/irq").glob("*/smp_affinity_list"), *Path("/sys/class/net").glob("*/queues/*/rps_cpus"),
             *Path("/sys/class/net").glob("*/queues/*/xps_cpus")]
    for path in paths:
        try:
            found[str(path)] = path.read_text().strip()
        except OSError:
            continue
    for directory in found["cpusets"]:
        found[f"{directory}/cpuset.cpus"] = Path(directory, "cpuset.cpus").read_text().strip()
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            stat = task.joinpath("stat").read_text()
            if _is_irq_thread(stat):
                continue
            start = stat.rsplit(")", 1)[1].split()[19]
            cpus = next(line.split()[1] for line in task.joinpath("status").read_text().splitlines()
                        if line.startswith("Cpus_allowed_list:"))
            cpuset = next(line.rsplit(":", 1)[1] for line in task.joinpath("cgroup").read_text().splitlines()
                          if line.split(":")[1] == "cpuset")
        except (OSError, StopIteration, IndexError):
            continue  # exited meanwhile
        found[f"task {task.name} {start}"] = (cpuset, cpus)
    return found


PF_KTHREAD = 0x00200000  # include/linux/sched.h


def _is_irq_thread(stat: str) -> bool:
    """A threaded interrupt handler's kernel thread ("irq/24-ACPI:Ged"). Its affinity follows its
    IRQ's, which the placement holds already, but only when the IRQ next fires (the kernel's
    irq_thread_check_affinity()): a snapshot taken after an earlier IRQ change can lag behind it."""
    comm = stat[stat.index("(") + 1: stat.rindex(")")]
    flags = int(stat.rsplit(")", 1)[1].split()[6])
    return bool(flags & PF_KTHREAD) and comm.startswith("irq/")


def placement_differences(before: dict, after: dict) -> list[str]:
    """What differs between two placements (tasks that exist in only one are not compared)."""
    differences = []
    for key in sorted(set(before) | set(after)):
        if key.startswith("task ") and (key not in before or key not in after):
            continue
        if before.get(key) != after.get(key):
            differences.append(f"{key}: {before.get(key)!r} -> {after.get(key)!r}")
    return differences


def runs(run, description: str) -> list:
    """``--runs N`` (default 1): ``run(state_dir)`` N times, each in a fresh state directory, each
    result's ``row()`` printed as it comes; returns the results."""
    import argparse
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as state:
            results.append(run(Path(state)))
        print(results[-1].row(), flush=True)
    return results


def start_watch(state_dir: Path, events: list, lab_plugin: bool = False, args: tuple = ()) -> subprocess.Popen:
    """`tuned-rl watch --json [ARGS]` on this host with ``state_dir`` (``lab_plugin``: the lab's plugin
    loaded too); its events are appended to ``events`` as they come. Returns once it has scanned
    /proc (it acts on what starts after)."""
    import threading
    env = {**os.environ, "TUNED_RL_STATE_DIR": str(state_dir)}
    env.pop("TUNED_RL_HOST_ROOT", None)
    if lab_plugin:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LAB_PLUGIN), env.get("PYTHONPATH")]))
    watch = subprocess.Popen([sys.executable, "-m", "tuned_rl.cli", "watch", "--json", *args],
                             stdout=subprocess.PIPE, text=True, env=env)
    threading.Thread(target=lambda: events.extend(json.loads(line) for line in watch.stdout), daemon=True).start()
    wait_for(lambda: any(e["event"] == "rescanned" for e in events) or watch.poll() is not None, 20, "watch to start")
    if watch.poll() is not None:
        raise RuntimeError(f"tuned-rl watch exited {watch.returncode}")
    return watch


def wait_for(condition, seconds: float, what: str, details=lambda: "") -> None:
    """Poll ``condition`` every 20 ms; AssertionError naming ``what`` (and ``details()``) after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {details()}")
        time.sleep(0.02)
