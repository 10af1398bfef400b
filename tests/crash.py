"""Helpers to stop tuned-rl at a named point of a step and kill it there with SIGKILL."""

import os
import signal
import time

from conftest import spawn_cli


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
