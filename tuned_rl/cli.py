"""The `tuned-rl` command line: parses arguments, runs the command, prints what its report renders
(each report renders itself, as a table and as JSON) and sets the exit status."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

from tuned_rl.core.agent import Agent, HostError
from tuned_rl.core.journal import DEFAULT_STATE_DIR, Journal, JournalError
from tuned_rl.core.lock import LockHeld, StateDirError
from tuned_rl.core.plugin_host import load_plugins
from tuned_rl.core.plugin_listing import PluginListing
from tuned_rl.core import metrics
from tuned_rl.core.report import to_diff
from tuned_rl.diagnose.profile_writer import write_profile
from tuned_rl.diagnose.report import format_diagnosis
from tuned_rl.diagnose.run import diagnose
from tuned_rl.host import SCHED_POLICIES, Host
from tuned_rl.measure.canary import CanarySpec
from tuned_rl.measure.doctor import examine, format_examination
from tuned_rl.measure.measure_report import MeasureReport
from tuned_rl.measure.measurement import measure_target
from tuned_rl.measure.probes import PROBE_CHOICES, ProbeError
from tuned_rl.measure.targets import TARGET_TABLE, Target, TargetError, target_problems
from tuned_rl.profiles.loader import ProfileError, load_profile
from tuned_rl.profiles.schema import Problem

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # as a process killed by SIGPIPE, which a shell pipeline expects


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of 0 or more, not {text}")
    return value


def _add_canary_arguments(parser: argparse.ArgumentParser) -> None:
    canary = parser.add_argument_group("canary (with --target canary)")
    canary.add_argument("--canary-period-us", type=_positive(int), default=CanarySpec.period_us,
                        help="wake every (default %(default)s)")
    canary.add_argument("--canary-work-us", type=_non_negative_int, default=0, help="busy work per wake")
    canary.add_argument("--canary-threads", type=_positive(int), default=CanarySpec.threads,
                        help="waking threads (default %(default)s)")
    canary.add_argument("--canary-cpus", help="CPU list to pin the canary to, e.g. 0 or 2-3")
    canary.add_argument("--canary-policy", choices=sorted(SCHED_POLICIES), default="SCHED_OTHER")
    canary.add_argument("--canary-priority", type=_non_negative_int, default=0, help="1-99 for FIFO/RR")
    canary.add_argument("--canary-cgroup", help="cgroupfs directory to start the canary in")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuned-rl", description=__doc__)
    parser.add_argument("--state-dir", default=os.environ.get("TUNED_RL_STATE_DIR", DEFAULT_STATE_DIR),
                        help="journal and lock directory (env TUNED_RL_STATE_DIR; default %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    apply = commands.add_parser("apply", help="plan, then apply each step of a profile")
    apply.add_argument("profile", help="profile file (TOML)")
    apply.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    apply.add_argument("--no-verify", action="store_true", help="apply without latency verification")
    apply.add_argument("--max-blocks", type=int, metavar="N",
                       help="switchback blocks at most per step, in place of the profile's [verify] max_blocks "
                            "(more: an undecided step measures longer before it is inconclusive)")
    apply.add_argument("--format", choices=("table", "diff"), default="table",
                       help="diff: the plan as a unified-diff-style listing of live values (with --dry-run)")
    apply.add_argument("--metrics-file", help="also write Prometheus metrics here (node_exporter textfile "
                                              "collector), atomically")
    measure = commands.add_parser("measure", help="one latency measurement of a target")
    measure.add_argument("--target", required=True, type=_target,
                         help="pid:PID, name:REGEX, cgroup:PATH (cgroupfs directory), unit:NAME, or canary")
    measure.add_argument("--seconds", type=_positive(float), default=10.0, help="how long (default %(default)s)")
    measure.add_argument("--window-seconds", type=_positive(float), default=1.0,
                         help="length of each window (default %(default)s)")
    measure.add_argument("--probe", choices=PROBE_CHOICES, default="auto", help="default %(default)s")
    measure.add_argument("--ioctl", metavar="FUNCTION",
                         help="also time the target's calls of this kernel function, a driver's ioctl "
                              "(nvidia_ioctl, tty_ioctl): a kprobe/kretprobe, or the ioctl system call where "
                              "the kernel has no kprobes")
    measure.add_argument("--user", action="append", metavar="USER",
                         help="with name:REGEX, an account whose processes may be the target (repeat for more; "
                              "default root): another user's process of that name is left out")
    _add_canary_arguments(measure)
    diagnose = commands.add_parser(
        "diagnose", help="who the workload waits behind, which known cause is present, and a profile that fixes it",
        description="Measures the target's run-queue latency with the eBPF probe and attributes every "
                    "microsecond of its waiting to what held the CPU meanwhile (a task, an interrupt, a softirq, "
                    "the idle task); then checks the known causes (offline jobs, RT throttling, interrupts, remote "
                    "memory, a virtual machine). Changes nothing.")
    diagnose.add_argument("--target", required=True, type=_target,
                          help="pid:PID, name:REGEX, cgroup:PATH (cgroupfs directory), unit:NAME, or canary")
    diagnose.add_argument("--seconds", type=_positive(float), default=10.0, help="how long (default %(default)s)")
    diagnose.add_argument("--write-profile", metavar="PATH",
                          help="write a profile with the recommended tables here (not over an existing file)")
    diagnose.add_argument("--gpu", help='the GPU the target feeds ("0000:3b:00.0" or "nvidia0"): its memory is '
                                        "checked against that GPU's NUMA node")
    diagnose.add_argument("--ioctl", metavar="FUNCTION",
                          help="time the target's calls of this driver function (default: nvidia_ioctl where the "
                               "nvidia module is loaded)")
    diagnose.add_argument("--save-raw", metavar="PATH",
                          help="also save the probe's sums and the facts read, as JSON (to attach to a report)")
    diagnose.add_argument("--user", action="append", metavar="USER",
                         help="with name:REGEX, an account whose processes may be the target (repeat for more; "
                              "default root): another user's process of that name is left out")
    _add_canary_arguments(diagnose)
    run = commands.add_parser("exec", help="run a command bound to one NUMA node's CPUs and memory",
                              description="As `numactl --cpunodebind N --membind N`: CPU affinity to the node's "
                                          "CPUs and a bind memory policy, set in this process, then the command "
                                          "replaces it (argv as given, never a shell). Exit status: the command's.")
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", type=_non_negative_int, help="the NUMA node")
    where.add_argument("--gpu", help='the node of this GPU: a PCI address ("0000:3b:00.0") or "nvidia0"')
    where.add_argument("--profile", help="the node a profile's [numa] table names")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    commands.add_parser("doctor", help="can this host measure latency? what is wrong?")
    rollback = commands.add_parser("rollback", help="undo everything the journal holds, newest first")
    rollback.add_argument("--force", action="store_true",
                          help="also restore values someone changed since the apply (default: keep theirs)")
    watch = commands.add_parser(
        "watch", help="keep the applied profile in force for processes that start later (foreground)",
        description="Reads the applied profile from the journal and applies its per-process rules (eviction, "
                    "and the other plugins' tuned_rl_plan_process) to each process that starts, renames "
                    "itself or changes user, journaling every change as apply does; /proc is rescanned after "
                    "lost events and periodically. SIGTERM or Ctrl-C ends it and leaves the tuning; "
                    "`tuned-rl rollback` undoes all of it, late processes included. Exit 1: nothing applied.")
    watch.add_argument("--rescan-seconds", type=_positive(float), default=30.0,
                       help="rescan /proc this often, a backstop for lost events (default %(default)s)")
    watch.add_argument("--warm-up-seconds", type=_non_negative_float, default=2.0,
                       help="after the workload starts, wait this long before verifying a deferred step "
                            "(default %(default)s)")
    watch.add_argument("--metrics-address", nargs="?", const="127.0.0.1:9464", default=None, metavar="ADDRESS",
                       help="serve Prometheus metrics at http://ADDRESS/metrics (default when given without a value: "
                            "%(const)s; a port alone is loopback; another address only as an IP address)")
    watch.add_argument("--node-class", type=_node_class, metavar="CLASS",
                       help="label the latency histogram on /metrics node_class=CLASS (this kind of node: hardware, "
                            "kernel), for a fleet query to group by")
    watch.add_argument("--alarm-ms", type=_positive(float), default=10.0,
                       help="a wait of the target this long is an alarm that names what held its CPU "
                            "(default %(default)s)")
    watch.add_argument("--regressed-window-seconds", type=_positive(float), default=300.0,
                       help="the sliding window whose p999 is compared with the verified one (default %(default)s)")
    watch.add_argument("--regressed-factor", type=_positive(float), default=2.0,
                       help="\"regressed\": the window's p999 over the verified p999 times this (default %(default)s)")
    watch.add_argument("--no-measure", action="store_true",
                       help="do not measure the target (no alarms, no regressed check, no latency metrics)")
    fleet = commands.add_parser("fleet", help="judge a roll-out across nodes, from Prometheus")
    fleet_commands = fleet.add_subparsers(dest="fleet_command", required=True, metavar="FLEET_COMMAND")
    judge = fleet_commands.add_parser(
        "judge", help="treated nodes against control nodes, on the same hours, from Prometheus",
        description="Reads every node's tuned_rl_runqueue_latency_seconds histogram (watch's /metrics, as "
                    "Prometheus stored it) through Prometheus's /api/v1/query_range, the treated and the control "
                    "nodes over the same window in sub-windows, and decides whether the treated nodes' p999 is "
                    "worse than the control's beyond the tolerance (docs/fleet.md says how, with its error rates). "
                    "Exit status: 0 pass, 1 fail, 2 bad input, 3 inconclusive, 4 Prometheus could not be read.")
    judge.add_argument("--prometheus", required=True, metavar="URL", help="the Prometheus server, http://HOST:9090")
    judge.add_argument("--selector", default="", metavar="MATCHERS",
                       help='label matchers every node must match, such as job="tuned-rl",node_class="a100"')
    judge.add_argument("--treated", default="", metavar="MATCHERS", help="label matchers of the treated nodes")
    judge.add_argument("--treated-nodes", metavar="NODE,...",
                       help="the treated nodes by name (their --node-label value); one listed without data is named")
    judge.add_argument("--control", default="", metavar="MATCHERS", help="label matchers of the control nodes")
    judge.add_argument("--control-nodes", metavar="NODE,...", help="the control nodes by name")
    judge.add_argument("--node-label", default="instance", help="the label that names a node (default %(default)s)")
    judge.add_argument("--end", type=_instant, default="now",
                       help="the end of the window: now, Unix seconds or ISO 8601 (default %(default)s)")
    judge.add_argument("--window", type=_duration, default=900.0,
                       help="its length: seconds, or 30s, 15m, 2h (default 15m)")
    judge.add_argument("--step", type=_duration, default=60.0,
                       help="a sub-window, at least the scrape interval (default 60s)")
    judge.add_argument("--changed-at", type=_instant, metavar="TIME",
                       help="when the treated nodes changed: each node's window before it is compared too, so a "
                            "node's own level leaves the test")
    judge.add_argument("--tolerance", type=_non_negative_float, default=0.1,
                       help="a treated p999 this much worse (0.1: x1.1) is not a regression (default %(default)s)")
    judge.add_argument("--harm", type=_positive(float), default=1.5,
                       help="pass rules out a treated p999 this many times the control's (default %(default)s)")
    judge.add_argument("--min-waits", type=_positive(int), default=2000,
                       help="a sub-window with fewer waits is left out (default %(default)s)")
    for name, text in [("status", "what is applied, and whether it drifted"),
                       ("plugins", "loaded plugins and the tables they own")]:
        commands.add_parser(name, help=text)
    for sub in [*commands.choices.values(), judge]:
        if sub is fleet:
            continue
        sub.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        sub.add_argument("--state-dir", default=argparse.SUPPRESS, help="as before the command")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # TUNED_RL_HOST_ROOT points every /proc and /sys access at another tree (tests).
    host = Host(os.environ.get("TUNED_RL_HOST_ROOT") or "/")
    _say_what_test_hooks_change(host)
    plugins = load_plugins()
    for failure in plugins.failures:
        print(f"tuned-rl: plugin {failure.name} failed to load: {failure.error}", file=sys.stderr)
    for warning in plugins.warnings:
        print(f"tuned-rl: plugin {warning.name}: deprecated: {warning.warning}", file=sys.stderr)
    show = _progress_printer()
    agent = Agent(plugins, host, Journal(args.state_dir), progress=lambda message: show(message, end="\r"))
    try:
        return COMMANDS[args.command](agent, args)
    except (LockHeld, StateDirError, HostError, JournalError) as err:
        print(f"tuned-rl: {err}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # whoever read the output stopped (`| head`): not the host's doing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return EXIT_BROKEN_PIPE
    except OSError as err:  # the host lacks a file a plugin reads, or refuses access
        print(f"tuned-rl: cannot read the host: {err.filename or ''}: {err.strerror}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        show("", end="")  # clear the last progress line


def cmd_apply(agent: Agent, args) -> int:
    try:
        profile = load_profile(args.profile)
        problems = agent.plugins.validate(profile, agent.host)
    except ProfileError as err:
        problems = err.messages
    if problems:
        for message in problems[:-1]:
            print(f"tuned-rl: {message}", file=sys.stderr)
        print(f"tuned-rl: {problems[-1]} (the profile was rejected; nothing was changed)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.format == "diff" and not args.dry_run:
        print("tuned-rl: --format diff shows a plan: use it with --dry-run", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.max_blocks is not None and not 2 <= args.max_blocks <= 100:
        print(f"tuned-rl: --max-blocks {args.max_blocks}: give 2 to 100 blocks", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.metrics_file and not os.path.isdir(os.path.dirname(os.path.abspath(args.metrics_file))):
        print(f"tuned-rl: --metrics-file {args.metrics_file}: its directory does not exist", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.dry_run and not _may_change(agent.host, "apply"):
        return EXIT_FAILED
    started = time.time()
    if args.dry_run:
        report, status = agent.dry_run(profile), EXIT_OK
    else:
        report, status = agent.apply(profile, verify=not args.no_verify, max_blocks=args.max_blocks)
    if args.json:
        print(report.to_json())
    else:
        print(to_diff(report) if args.format == "diff" else report.to_text())
    if args.metrics_file:
        metrics.write(args.metrics_file, metrics.render(report, started, time.time(), status))
    return status


def cmd_exec(agent: Agent, args) -> int:
    from tuned_rl.host.numa import NumaError, bind_memory, gpu_node, topology
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        print("tuned-rl: exec: name the command after --: tuned-rl exec --node 0 -- CMD ARGS...", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        node = args.node
        if args.gpu is not None:
            node = gpu_node(agent.host, args.gpu)
        elif args.profile is not None:
            node = _profile_node(agent, args.profile)
        cpus = topology(agent.host).node_cpus(node)
    except (NumaError, ProfileError) as err:
        print(f"tuned-rl: exec: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        os.sched_setaffinity(0, cpus)
        bind_memory({node})
    except OSError as err:
        print(f"tuned-rl: exec: cannot bind to node {node}: {err}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.flush()
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        print(f"tuned-rl: exec: {argv[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as err:
        print(f"tuned-rl: exec: {argv[0]}: {err.strerror}", file=sys.stderr)
        return 126


def _profile_node(agent: Agent, path: str) -> int:
    from tuned_rl.host.numa import NumaError, node_of
    table = load_profile(path).get("numa")
    if not table or ("node" not in table and "gpu" not in table):
        raise NumaError(f"{path} has no [numa] table naming node or gpu")
    return node_of(agent.host, table)


def cmd_rollback(agent: Agent, args) -> int:
    if not _may_change(agent.host, "rollback"):
        return EXIT_FAILED
    report, status = agent.rollback(force=args.force)
    print(report.to_json() if args.json else report.to_text())
    return status


def cmd_status(agent: Agent, args) -> int:
    report = agent.status()
    print(report.to_json() if args.json else report.to_text())
    return EXIT_OK


def cmd_plugins(agent: Agent, args) -> int:
    listing = PluginListing(agent.plugins)
    print(listing.to_json() if args.json else listing.to_text())
    return EXIT_OK


def cmd_measure(agent: Agent, args) -> int:
    if _said_target_problems(agent.host, args):
        return EXIT_BAD_INPUT
    if args.ioctl and args.target.kind == "canary":
        print("tuned-rl: --ioctl: the canary makes no driver calls: name the workload with --target",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    spec = _canary_spec(args)
    windows = max(1, round(args.seconds / args.window_seconds))
    try:
        measurement = measure_target(agent.host, args.target, windows, args.window_seconds, args.probe, spec,
                                     lambda left: agent.progress(f"measuring {args.target}: {max(left, 0):.0f} s left"),
                                     ioctl=args.ioctl)
    except (ProbeError, TargetError) as err:
        print(f"tuned-rl: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        agent.progress("")  # clear the progress line before the figures
    report = MeasureReport(str(args.target), measurement)
    print(report.to_json() if args.json else report.to_text())
    return EXIT_OK


def _canary_spec(args) -> CanarySpec:
    return CanarySpec(period_us=args.canary_period_us, work_us=args.canary_work_us, threads=args.canary_threads,
                      cpus=args.canary_cpus, policy=args.canary_policy, priority=args.canary_priority,
                      cgroup=args.canary_cgroup)


def cmd_diagnose(agent: Agent, args) -> int:
    if _said_target_problems(agent.host, args):
        return EXIT_BAD_INPUT
    for option, path in (("--write-profile", args.write_profile), ("--save-raw", args.save_raw)):
        if path and not _path_free(option, path):
            return EXIT_BAD_INPUT
    gpu = None
    if args.gpu:
        from tuned_rl.host.numa import NumaError, gpu_node
        try:
            gpu = (args.gpu, gpu_node(agent.host, args.gpu))
        except NumaError as err:
            print(f"tuned-rl: --gpu: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
    spec = _canary_spec(args) if args.target.kind == "canary" else None
    try:
        diagnosis = diagnose(agent.host, args.target, args.seconds, spec,
                             lambda left: agent.progress(f"diagnosing {args.target}: {max(left, 0):.0f} s left"), gpu,
                             args.ioctl)
    except (ProbeError, TargetError) as err:
        print(f"tuned-rl: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        agent.progress("")
    result = diagnosis.to_dict()
    if args.save_raw:
        with open(args.save_raw, "x") as handle:
            json.dump(diagnosis.recording, handle, indent=1)
    if args.write_profile:
        text = write_profile(f"diagnosed-{args.target.kind}", args.target, spec, diagnosis.findings,
                             result["latency"])
        with open(args.write_profile, "x") as handle:
            handle.write(text)
        result["profile_written"] = args.write_profile
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    print("\n".join(format_diagnosis(result)))
    if args.write_profile:
        print(f"\nprofile written to {args.write_profile}: review it, then `tuned-rl apply {args.write_profile}`")
    return EXIT_OK


def _path_free(option: str, path: str) -> bool:
    """A file diagnose may create: not one that exists (nor a link), in a directory that does."""
    if os.path.lexists(path):
        print(f"tuned-rl: {option} {path}: the file exists; choose another path or remove it", file=sys.stderr)
        return False
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        print(f"tuned-rl: {option} {path}: no directory {parent}", file=sys.stderr)
        return False
    return True


def cmd_doctor(agent: Agent, args) -> int:
    report = examine(agent.host)
    print(json.dumps(report, indent=2) if args.json else format_examination(report))
    return EXIT_OK if report["auto"] else EXIT_FAILED


def _said_target_problems(host: Host, args) -> bool:
    """Print what is wrong with --target and the canary options, as options; True if anything is."""
    problems = _measure_problems(host, args)
    for problem in problems:
        key = "--user" if problem.key == "target.users" else problem.key.replace('target.', '--', 1).replace('_', '-')
        print(f"tuned-rl: {key}: {problem.message}", file=sys.stderr)
    if not problems and args.user:
        args.target = dataclasses.replace(args.target, users=tuple(args.user))
    return bool(problems)


def _measure_problems(host: Host, args) -> list:
    """The arguments as a [target] table, checked as a profile's would be (and schedstat: canary only)."""
    target = args.target
    if target.kind != "canary":
        table = {target.kind: int(target.value) if target.kind == "pid" else target.value}
        if args.user:
            table["users"] = list(args.user)
        if getattr(args, "probe", None) == "schedstat":  # diagnose has no --probe: it runs its own
            return [Problem("target.probe", "schedstat measures a canary only (it reads the canary's own "
                                            "schedstat); use bpf or tracefs for a workload")]
    elif args.user:
        return [Problem("target.users", "goes with a name target")]
    else:
        table = {"canary": True, **{f"canary_{k}": v for k, v in (("cpus", args.canary_cpus),
                                                                   ("cgroup", args.canary_cgroup)) if v}}
    return TARGET_TABLE.check(table, host) or target_problems(table, host)




def cmd_watch(agent: Agent, args) -> int:
    if not _may_change(agent.host, "watch"):
        return EXIT_FAILED
    from tuned_rl.watch.daemon import DaemonOptions, run_daemon
    return run_daemon(agent, DaemonOptions(
        json=args.json, metrics_address=args.metrics_address, measure=not args.no_measure, alarm_ms=args.alarm_ms,
        regressed_window_s=args.regressed_window_seconds, regressed_factor=args.regressed_factor,
        rescan_s=args.rescan_seconds, warm_up_s=args.warm_up_seconds, node_class=args.node_class or ""))


EXIT_FLEET = {"pass": EXIT_OK, "fail": EXIT_FAILED, "inconclusive": 3}
EXIT_PROMETHEUS = 4


def cmd_fleet(agent: Agent, args) -> int:
    from tuned_rl.fleet.fleet_run import FleetQuery, Side, format_judgement, run_fleet_judge
    from tuned_rl.fleet.prometheus import PrometheusError
    from tuned_rl.fleet.selection import SelectionError, parse_nodes, parse_selector
    from tuned_rl.fleet.verdict import FleetSettings
    try:
        query = FleetQuery(
            args.prometheus,
            Side(tuple(parse_selector(args.treated)), tuple(parse_nodes(args.treated_nodes)) if args.treated_nodes else ()),
            Side(tuple(parse_selector(args.control)), tuple(parse_nodes(args.control_nodes)) if args.control_nodes else ()),
            args.end, args.window, args.step, args.changed_at, args.node_label, tuple(parse_selector(args.selector)),
            FleetSettings(tolerance=args.tolerance, harm=args.harm, min_waits=args.min_waits))
        judgement = run_fleet_judge(query)
    except SelectionError as err:
        print(f"tuned-rl: fleet judge: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PrometheusError as err:
        print(f"tuned-rl: fleet judge: {err}", file=sys.stderr)
        return EXIT_PROMETHEUS
    print(json.dumps(judgement.to_dict(), indent=2) if args.json else format_judgement(judgement))
    return EXIT_FLEET[judgement.verdict.outcome]


COMMANDS = {"apply": cmd_apply, "fleet": cmd_fleet, "watch": cmd_watch, "rollback": cmd_rollback, "status": cmd_status, "plugins": cmd_plugins,
            "measure": cmd_measure, "diagnose": cmd_diagnose, "doctor": cmd_doctor, "exec": cmd_exec}


def _may_change(host: Host, command: str) -> bool:
    """Changing the live host needs root: say so before anything is touched."""
    if host.moved_root is None and os.geteuid() != 0:
        print(f"tuned-rl: {command} needs root (it changes kernel settings and tasks of other users); nothing "
              "was changed. `tuned-rl apply --dry-run` shows a plan without root.", file=sys.stderr)
        return False
    return True


def _say_what_test_hooks_change(host: Host) -> None:
    """The variables the tests use change what a run writes: never let one steer a run silently."""
    if host.moved_root is not None:
        print(f"tuned-rl: TUNED_RL_HOST_ROOT={host.moved_root}: reading and writing the tree there, not this host's "
              "/proc and /sys", file=sys.stderr)
    if os.environ.get("TUNED_RL_PAUSE_AT"):
        print(f"tuned-rl: TUNED_RL_PAUSE_AT={os.environ['TUNED_RL_PAUSE_AT']}: this process will stop itself "
              "there (a crash test's hook)", file=sys.stderr)


def _progress_printer():
    """Progress goes to stderr, and only to a terminal: --json output stays clean."""
    if not sys.stderr.isatty():
        return lambda message, end="\n": None
    return lambda message, end="\n": print(f"\x1b[2K{message}", end=end, file=sys.stderr, flush=True)


def _target(text: str) -> Target:
    try:
        return Target.parse(text)
    except TargetError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _instant(text: str) -> float:
    """now, Unix seconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    import datetime
    if text == "now":
        return time.time()
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not now, Unix seconds or an ISO 8601 time: {text}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        value = moment.timestamp()
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"not a time: {text}")
    return value


def _duration(text: str) -> float:
    """Seconds, or a number with s, m, h or d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        value = float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration (seconds, or 30s, 15m, 2h): {text}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"a duration above 0, not {text}")
    return value


def _node_class(text: str) -> str:
    from tuned_rl.watch.metrics_endpoint import check_node_class
    try:
        return check_node_class(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not math.isfinite(value) or value <= 0:  # float("nan") <= 0 is False: nan got through, and crashed watch
            raise argparse.ArgumentTypeError(f"must be a number above 0, not {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())
