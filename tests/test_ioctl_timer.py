"""The ioctl timer's choices on trees (how a function can be timed, or why not) and its figures."""


from __future__ import annotations
import numpy as np
import pytest

from tuned_rl.measure.probes.bpf import FINE_BUCKETS, FINE_BUCKET_MIDDLES
from tuned_rl.measure.probes.ioctl import IoctlAbsent, IoctlTimes, format_times, how_to_time, kernel_symbol

KALLSYMS = ("ffffffff81235f82 t tty_ioctl.cold\nffffffff81d417a0 T tty_ioctl\n"
            "ffffffffc0a01230 t nvidia_ioctl\t[nvidia]\nffffffff81000010 t twice\nffffffff81000020 t twice\n"
            "ffffffff81000030 D tty_data\n")


@pytest.fixture
def kernel(tree):
    tree.set("/proc/kallsyms", KALLSYMS)
    tree.set("/sys/kernel/tracing/events/syscalls/sys_enter_ioctl/format", "name: sys_enter_ioctl\n")
    return tree


def test_a_function_is_found_by_its_exact_text_symbol_a_modules_too(kernel):
    assert kernel_symbol(kernel.host, "tty_ioctl") == [0xffffffff81d417a0]  # not tty_ioctl.cold
    assert kernel_symbol(kernel.host, "nvidia_ioctl") == [0xffffffffc0a01230]
    assert kernel_symbol(kernel.host, "tty_data") == []  # data, not a function


def test_kprobes_where_the_kernel_has_them_else_the_ioctl_system_call(kernel):
    assert how_to_time(kernel.host, "tty_ioctl") == "syscall"
    kernel.set("/sys/bus/event_source/devices/kprobe/type", "6")
    assert how_to_time(kernel.host, "tty_ioctl") == "kprobe"
    assert how_to_time(kernel.host, "twice") == "kprobe"  # a kprobe on a name takes the first


@pytest.mark.parametrize("function, files, message", [
    ("nvidia_ioctl", {"/proc/kallsyms": "ffffffff81d417a0 T tty_ioctl\n"}, "the nvidia module is not loaded"),
    ("no_such_fn", {}, "is not a function of this kernel or its loaded modules"),
    ("twice", {}, "names 2 functions"),
    ("tty_ioctl", {"/proc/kallsyms": "0000000000000000 T tty_ioctl\n"}, "kptr_restrict"),
    ("tty_ioctl; rm", {}, "is not a kernel function name"),
])
def test_a_function_that_cannot_be_timed_says_why(kernel, function, files, message):
    for path, text in files.items():
        kernel.set(path, text)
    with pytest.raises(IoctlAbsent, match=message):
        how_to_time(kernel.host, function)


def test_without_kprobes_or_syscall_tracepoints_nothing_can_time_it(kernel):
    kernel.host.path("/sys/kernel/tracing/events/syscalls/sys_enter_ioctl/format").unlink()
    kernel.host.path("/sys/kernel/tracing/events/syscalls/sys_enter_ioctl").rmdir()
    with pytest.raises(IoctlAbsent, match="neither kprobes"):
        how_to_time(kernel.host, "tty_ioctl")


def _times(lengths_ns: list[int]) -> IoctlTimes:
    counts = np.zeros(FINE_BUCKETS, dtype=np.int64)
    for ns in lengths_ns:
        counts[int(np.argmin(np.abs(FINE_BUCKET_MIDDLES - ns)))] += 1
    return IoctlTimes("tty_ioctl", "syscall", counts, sum(lengths_ns), max(lengths_ns), 0)


def test_the_figures_are_the_calls_their_sum_and_quantiles_never_past_the_longest():
    figures = _times([2_000_000] * 99 + [5_000_000]).to_dict()
    assert figures["calls"] == 100 and figures["total_ms"] == 203.0 and figures["mean_us"] == 2030.0
    assert abs(figures["p50_us"] - 2000) < 2000 * 0.045 and figures["p999_us"] <= figures["max_us"] == 5000.0
    [header, row] = format_times(figures)
    assert header.split() == ["IOCTL", "CALLS", "TOTAL", "MEAN", "P50", "P99", "P999", "MAX", "LOST", "HOW"]
    assert row.split()[:3] == ["tty_ioctl", "100", "203.0ms"]
    assert format_times({"function": "nvidia_ioctl", "absent": "the nvidia module is not loaded"}) == [
        "ioctl timer: nvidia_ioctl is not timed: the nvidia module is not loaded"]
