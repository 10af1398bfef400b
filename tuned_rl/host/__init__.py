"""Host access: every read and write of /proc, /sys and cgroupfs, below a root that tests can move."""

from tuned_rl.host.host import SCHED_POLICIES, Host, Task, TaskGone, format_cpu_list, parse_cpu_list

__all__ = ["SCHED_POLICIES", "Host", "Task", "TaskGone", "format_cpu_list", "parse_cpu_list"]
