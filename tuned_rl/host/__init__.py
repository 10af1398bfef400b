"""Host access: every read and write of /proc, /sys and cgroupfs, below a root that tests can move."""

from tuned_rl.host.cpus import format_cpu_list, format_cpu_mask, parse_cpu_list, parse_cpu_mask
from tuned_rl.host.cgroup_access import CgroupMount
from tuned_rl.host.host import Host
from tuned_rl.host.task_calls import SCHED_POLICIES
from tuned_rl.host.tasks import Task, TaskGone
from tuned_rl.host.processes import ProcessInfo
from tuned_rl.host.untrusted import printable

__all__ = ["SCHED_POLICIES", "CgroupMount", "Host", "ProcessInfo", "Task", "TaskGone", "format_cpu_list",
           "format_cpu_mask", "parse_cpu_list", "parse_cpu_mask", "printable"]
