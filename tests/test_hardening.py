"""What whoever can plant a file, a link or a journal record must not gain; test hooks that say so."""


from __future__ import annotations
import json
import os

import pytest

RT = "/proc/sys/kernel/sched_rt_runtime_us"
PROFILE = "[rt_runtime]\nglobal_runtime_us = 900000\n"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown)")


def test_the_state_directory_is_created_private(tree, cli, profile_file, state_dir):
    assert cli("apply", profile_file(PROFILE))[0] == 0
    for directory in (state_dir, state_dir / "journal"):
        assert directory.stat().st_mode & 0o777 == 0o700 and directory.stat().st_uid == os.geteuid()
    assert (state_dir / "lock").stat().st_mode & 0o777 == 0o600


@needs_root
@pytest.mark.parametrize("spoil, words", [
    (lambda d: os.chown(d, 65534, 65534), "owned by uid 65534"),
    (lambda d: os.chmod(d, 0o775), "writable by group or others (mode 775)"),
    (lambda d: os.chmod(d, 0o777), "writable by group or others (mode 777)"),
])
@pytest.mark.parametrize("command", ["apply", "rollback", "status"])
def test_a_state_directory_someone_else_could_write_is_refused(spoil, words, command, tree, cli, profile_file,
                                                              state_dir):
    state_dir.mkdir(mode=0o700)
    spoil(state_dir)
    before = tree.snapshot()
    status, out, err = cli(command, *([profile_file(PROFILE)] if command == "apply" else []))
    assert status == 1 and str(state_dir) in err and words in err and "fix: ch" in err, err
    assert tree.snapshot() == before and sorted(os.listdir(state_dir)) == []


def test_a_symlink_planted_as_the_state_directory_is_not_followed(tree, cli, profile_file, state_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    state_dir.symlink_to(elsewhere)
    before = tree.snapshot()
    status, _, err = cli("apply", profile_file(PROFILE))
    assert status == 1 and "is a symbolic link" in err
    assert tree.snapshot() == before and os.listdir(elsewhere) == []


@pytest.mark.parametrize("planted", ["lock", "journal", "journal/.000001.jsonl.tmp", "journal/.applied.json.tmp"])
def test_a_symlink_planted_in_the_state_directory_is_never_written_through(planted, tree, cli, profile_file,
                                                                            state_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state_dir / "journal").mkdir(mode=0o700, parents=True)
    os.chmod(state_dir, 0o700)
    if planted == "journal":
        os.rmdir(state_dir / "journal")
        victim.unlink()
        victim.mkdir(mode=0o700)
    (state_dir / planted).symlink_to(victim)
    status, _, err = cli("apply", profile_file(PROFILE))
    if planted in ("lock", "journal"):
        assert status == 1 and "symbolic link" in err and tree.get(RT) == "950000"
    else:  # a stale temporary name: the link is replaced, never followed
        assert status == 0 and tree.get(RT) == "900000"
        assert cli("rollback")[0] == 0
    assert (victim.read_text() == "precious\n") if victim.is_file() else os.listdir(victim) == []


def plant_record(state_dir, tree, seq: int, change: dict, root=None) -> None:
    journal = state_dir / "journal"
    journal.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    boot = tree.get("/proc/sys/kernel/random/boot_id")
    header = {"format": 2, "seq": seq, "boot_id": boot, "plugin": "p", "step": "s", "step_index": 0,
              "host_root": str(root or tree.root)}
    (journal / f"{seq:06d}.jsonl").write_text(json.dumps(header) + "\n" + json.dumps({"change": change}) + "\n")


def test_a_record_naming_a_file_outside_tuned_rls_places_is_refused_and_the_file_untouched(tree, cli, profile_file,
                                                                                          state_dir):
    tree.set("/etc/shadow", "root:secret:::")
    assert cli("apply", profile_file(PROFILE))[0] == 0  # one honest record, to be rolled back
    plant_record(state_dir, tree, 7, {"kind": "file", "target": "/etc/shadow", "before": "root::::",
                                      "after": "root:secret:::"})
    status, _, err = cli("apply", profile_file(PROFILE))
    assert status == 1 and "will not replay" in err and "/etc/shadow is outside the places" in err
    status, out, err = cli("rollback", "--json")
    report = json.loads(out)
    assert status == 1 and "/etc/shadow is outside the places tuned-rl writes" in report["refused"][0]["reason"]
    assert tree.get("/etc/shadow") == "root:secret:::"  # never written
    assert tree.get(RT) == "950000"  # the honest record still rolled back
    assert os.listdir(report["refused_kept_in"]) == ["000007.jsonl"]
    assert cli("rollback")[0] == 0 and cli("apply", profile_file(PROFILE))[0] == 0
    cli("rollback")


def test_a_record_that_does_not_parse_is_reported_and_the_others_still_roll_back(tree, cli, profile_file, state_dir):
    assert cli("apply", profile_file(PROFILE))[0] == 0
    (state_dir / "journal" / "000009.jsonl").write_text('{"format": 2, "seq": 9, "boot_i')
    status, out, err = cli("status")
    assert status == 0 and "000009.jsonl" in out and "refused" in out
    status, out, err = cli("rollback")
    assert status == 1 and "Traceback" not in err
    assert "000009.jsonl: cannot be read as a tuned-rl journal record" in out and "moved to" in out
    assert tree.get(RT) == "950000"


def test_a_journal_written_against_another_host_root_is_not_replayed(tree, cli, profile_file, state_dir):
    assert cli("apply", profile_file(PROFILE))[0] == 0
    plant_record(state_dir, tree, 5, {"kind": "file", "target": RT, "before": "1", "after": "2"}, root="/")
    for command in ("rollback", "status"):
        status, _, err = cli(command)
        assert status == 1 and "written against host root /" in err and "TUNED_RL_HOST_ROOT=/" in err
    assert tree.get(RT) == "900000"


def test_every_command_says_when_a_test_hook_steers_it(tree, cli, monkeypatch):
    assert f"TUNED_RL_HOST_ROOT={tree.root}: reading and writing the tree there" in cli("status")[2]
    monkeypatch.setenv("TUNED_RL_PAUSE_AT", "written:9")
    assert "TUNED_RL_PAUSE_AT=written:9: this process will stop itself there" in cli("plugins")[2]


@pytest.mark.parametrize("content", [b"\xff\xfe[rt_runtime]\n", b"\x00\x01\x02binary", b"[sysctl]\n\"vm.swappiness\" = \"\xe9\"\n"])
def test_a_profile_that_is_not_utf8_text_is_one_line_and_exit_2(content, tree, cli, tmp_path):
    path = tmp_path / "p.toml"
    path.write_bytes(content)
    before = tree.snapshot()
    status, out, err = cli("apply", path)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 2  # the root notice, and the error
    assert str(path) in err and ("UTF-8" in err or "TOML syntax error" in err) and "Traceback" not in err
    assert tree.snapshot() == before


def test_pid_reused_during_the_call_is_gone_not_silently_done():
    import subprocess
    import sys
    from tuned_rl.host import Host, TaskGone
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    task = Host().task(child.pid)

    def exits_meanwhile(pid):  # the task dies while it is being changed
        child.kill()
        child.wait()

    with pytest.raises(TaskGone, match="exited while it was being changed"):
        Host().on_task(task, exits_meanwhile)


def test_output_read_by_a_reader_that_stopped_ends_quietly_not_as_a_host_error(tree, profile_file, state_dir):
    # `tuned-rl ... | head`: head exits, and the next write finds the pipe closed.
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    environment = {**os.environ, "TUNED_RL_STATE_DIR": str(state_dir), "TUNED_RL_HOST_ROOT": str(tree.root)}
    try:
        process = subprocess.run([sys.executable, "-m", "tuned_rl.cli", "apply", "--dry-run",
                                  str(profile_file(PROFILE))],
                                 env=environment, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert process.returncode == 128 + 13, process.stderr
    assert "cannot read the host" not in process.stderr and "Traceback" not in process.stderr


def test_a_process_name_with_control_characters_cannot_hide_or_forge_a_plan_row(tree, cli, profile_file):
    # A user names a job "job" + a newline + a fake row + an erase-line escape: the plan must show one
    # escaped row, not a second line a reviewer would read as tuned-rl's.
    forged = "job\n             rt_runtime: nothing  unchanged\x1b[2K"
    tree.add_process(700, "job", uid=65534, cmdline="burn")
    tree.set("/proc/700/stat", tree.get("/proc/700/stat").replace("(job)", f"({forged})"))
    tree.set("/proc/700/task/700/stat", tree.get("/proc/700/stat"))
    profile = profile_file('[offline_eviction]\ncgroup = false\npolicy = "SCHED_IDLE"\n'
                           '[[offline_eviction.match]]\ncmdline = "^burn$"\n')
    for args in (("--dry-run",), ("--dry-run", "--format", "diff")):
        status, out, err = cli("apply", profile, *args)
        assert status == 0, err
        assert "\x1b" not in out and "\n             rt_runtime" not in out
        assert "job\\n             rt_runtime: nothing  unchanged\\x1b[2K" in out


@pytest.mark.parametrize("mode, refused", [(0o777, True), (0o1777, False), (0o755, False)])
def test_a_state_directory_below_a_parent_others_can_write_is_refused(mode, refused, tree, cli, profile_file,
                                                                      tmp_path, monkeypatch):
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, mode)
    monkeypatch.setenv("TUNED_RL_STATE_DIR", str(parent / "state"))
    status, _, err = cli("apply", profile_file(PROFILE))
    if refused:
        assert status == 1 and f"{parent}, a parent of the state directory" in err and "mode 777" in err, err
        assert tree.get(RT) == "950000" and not (parent / "state").exists()
    else:
        assert status == 0, err
        assert cli("rollback")[0] == 0


@needs_root
def test_a_state_directory_below_another_users_parent_is_refused(tree, cli, profile_file, tmp_path, monkeypatch):
    parent = tmp_path / "theirs"
    parent.mkdir()
    os.chown(parent, 65534, 65534)
    monkeypatch.setenv("TUNED_RL_STATE_DIR", str(parent / "state"))
    status, _, err = cli("apply", profile_file(PROFILE))
    assert status == 1 and "is owned by uid 65534" in err and f"{parent}, a parent" in err, err


def test_a_symlink_planted_in_the_host_tree_is_never_written_through(tree, cli, profile_file, tmp_path):
    # Below TUNED_RL_HOST_ROOT a link (sys -> elsewhere) would turn a test tree's write into a write
    # outside it, on the real host if it pointed there.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "sched_rt_runtime_us").write_text("950000\n")
    kernel = tree.host.path("/proc/sys/kernel")
    target = kernel / "sched_rt_runtime_us"
    target.unlink()
    target.symlink_to(outside / "sched_rt_runtime_us")
    status, out, err = cli("apply", profile_file(PROFILE), "--no-verify")
    assert status == 1 and "is a symbolic link below the host root" in out + err, out + err
    assert (outside / "sched_rt_runtime_us").read_text() == "950000\n"
