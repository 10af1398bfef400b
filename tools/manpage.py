"""Write the tuned-rl(8) man page from the command line's own parser, so that it lists every command
and option the program has:

    .venv/bin/python tools/manpage.py > docs/tuned-rl.8

tests/test_manpage.py fails when docs/tuned-rl.8 is not what this writes; the Debian package
installs it (debian/tuned-rl.manpages).
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tuned_rl import cli  # noqa: E402
from tuned_rl.core.journal import DEFAULT_STATE_DIR  # noqa: E402

SUMMARY = "tune a host for a latency-critical workload, one verified, undoable step at a time"
DESCRIPTION = (
    "tuned-rl applies a profile (TOML) of tuning steps to a node that runs a latency-critical workload: "
    "RT budgets, sysctls, CPU and IRQ isolation, NUMA binding, offline-job eviction, SCHED_FIFO removal, and "
    "the steps of any third-party plugin. Each step is measured: the workload's run-queue latency, with eBPF, "
    "with the step and without it in alternating blocks, and a step that makes the slowest 0.1% of waits (the "
    "profile's metric, p999 by default) worse is reverted at once. Every change is written to a journal "
    "before it is made, so that tuned-rl rollback restores the host even after a crash or kill -9.")
EXIT_STATUSES = [
    (cli.EXIT_OK, "Success. For apply: every step was applied, kept or reverted (a reverted step is a verdict, "
                  "not an error; the report says why). For doctor: a latency probe can run."),
    (cli.EXIT_FAILED, "A step failed and was undone (apply), a change could not be restored (rollback), "
                      "a measurement failed, no probe can run (doctor), nothing is applied (watch), the journal "
                      "is locked by another tuned-rl, or the host refused a read or write."),
    (cli.EXIT_BAD_INPUT, "Bad input: an unknown option, a profile that does not validate (nothing was changed), "
                         "a target or argument that cannot be used."),
    (cli.EXIT_FLEET["inconclusive"], "fleet judge: inconclusive (too few nodes or waits to decide; it says how "
                                     "many would). Its pass is 0 and its fail 1."),
    (cli.EXIT_PROMETHEUS, "fleet judge: Prometheus could not be asked, or did not answer with a matrix."),
    (126, "exec: the command was found but could not be run."),
    (127, "exec: the command was not found. Otherwise exec's status is the command's own."),
    (cli.EXIT_BROKEN_PIPE, "Whoever read the output stopped reading (tuned-rl status | head), as a process "
                           "killed by SIGPIPE."),
]
ENVIRONMENT = [
    ("TUNED_RL_STATE_DIR", "The journal and lock directory, as --state-dir (default "
                           f"{DEFAULT_STATE_DIR})."),
    ("TUNED_RL_HOST_ROOT", "Points every /proc, /sys and /etc access at another tree; for tests only, and said "
                           "on standard error when set."),
]
FILES = [
    (DEFAULT_STATE_DIR, "The journal of every change (the undo records) and the lock."),
    ("/etc/tuned-rl/profile.toml", "The profile the tuned-rl unit applies at boot."),
    ("/etc/default/tuned-rl", "The unit's settings: TUNED_RL_PROFILE, TUNED_RL_ROLLBACK_ON_STOP, "
                              "TUNED_RL_WATCH_OPTIONS."),
    ("/lib/systemd/system/tuned-rl.service", "Applies the profile at boot, then runs tuned-rl watch; installed, "
                                             "not enabled."),
    ("/usr/share/tuned-rl/profiles", "Example profiles."),
]


def escape(text: str) -> str:
    """Text for troff: backslashes and hyphens escaped, no line starting with a control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in ".'" else line for line in text.split("\n"))


def option_help(action: argparse.Action) -> str:
    """The help text with argparse's %(default)s-style fields filled in, as --help shows them."""
    fields = {key: value for key, value in vars(action).items() if value is not argparse.SUPPRESS}
    if fields.get("choices") is not None:
        fields["choices"] = ", ".join(map(str, fields["choices"]))
    text = ((action.help or "") % fields).strip()
    if action.choices:  # not in the term: a long {A,B,...} cannot be broken across lines
        text = (text + "; " if text else "") + "one of " + ", ".join(map(str, action.choices))
    return text


def option_term(action: argparse.Action) -> str:
    """\\fB--seconds\\fR \\fISECONDS\\fR, or the positional's name in italics."""
    if not action.option_strings:
        return f"\\fI{escape(action.metavar or action.dest)}\\fR"
    names = ", ".join(f"\\fB{escape(name)}\\fR" for name in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or action.dest.upper()
    return f"{names} [\\fI{escape(metavar)}\\fR]" if action.nargs == "?" else f"{names} \\fI{escape(metavar)}\\fR"


def commands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Each command's parser and its one-line help, in the parser's order; a command with commands
    of its own (fleet) is named by each of them ("fleet judge")."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    found = {}
    for name, sub in subparsers.choices.items():
        if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
            found.update({f"{name} {inner}": value for inner, value in commands(sub).items()})
        else:
            found[name] = (sub, helps.get(name, ""))
    return found


def documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
            and a.help is not argparse.SUPPRESS]


def render(parser: argparse.ArgumentParser, package_version: str) -> str:
    lines = [f'.TH TUNED\\-RL 8 "" "tuned\\-rl {escape(package_version)}" "System Administration"',
             ".SH NAME", f"tuned\\-rl \\- {escape(SUMMARY)}",
             ".SH SYNOPSIS", ".B tuned\\-rl",
             "[\\fB\\-\\-state\\-dir\\fR \\fIDIR\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
             ".SH DESCRIPTION", escape(DESCRIPTION),
             ".SH OPTIONS"]
    for action in documented_actions(parser):
        lines += [".TP", option_term(action), escape(option_help(action))]
    lines.append(".SH COMMANDS")
    for name, (sub, summary) in commands(parser).items():
        lines += [f".SS {escape(name)}", escape(summary[:1].upper() + summary[1:] + ".")]
        if sub.description:
            lines += [".PP", escape(sub.description)]
        groups = [g for g in sub._action_groups if g._group_actions]
        for group in groups:
            actions = [a for a in group._group_actions if a in documented_actions(sub)]
            if group.title not in ("positional arguments", "options", "optional arguments") and actions:
                lines += [".PP", f"\\fI{escape(group.title[:1].upper() + group.title[1:])}\\fR:"]
            for action in actions:
                lines += [".TP", option_term(action), escape(option_help(action))]
    lines.append(".SH EXIT STATUS")
    for status, meaning in EXIT_STATUSES:
        lines += [".TP", f"\\fB{status}\\fR", escape(meaning)]
    lines.append(".SH ENVIRONMENT")
    for variable, meaning in ENVIRONMENT:
        lines += [".TP", f"\\fB{variable}\\fR", escape(meaning)]
    lines.append(".SH FILES")
    for path, meaning in FILES:
        lines += [".TP", f"\\fI{escape(path)}\\fR", escape(meaning)]
    lines += [".SH SEE ALSO", "\\fBsystemctl\\fR(1), \\fBnumactl\\fR(8), \\fBcgroups\\fR(7), \\fBsched\\fR(7)", ""]
    return "\n".join(lines)


def parser_without_environment() -> argparse.ArgumentParser:
    """The parser as a fresh shell builds it: defaults that read the environment at their defaults."""
    saved = os.environ.pop("TUNED_RL_STATE_DIR", None)
    try:
        return cli.build_parser()
    finally:
        if saved is not None:
            os.environ["TUNED_RL_STATE_DIR"] = saved


def main() -> None:
    sys.stdout.write(render(parser_without_environment(), version("tuned-rl")))


if __name__ == "__main__":
    main()
