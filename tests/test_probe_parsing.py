"""The tracefs probe pairs wakeups with switches in user space; the schedstat probe reads canary records."""


from __future__ import annotations
import os


from tuned_rl.measure.canary import RECORD
from tuned_rl.measure.probes.schedstat import SchedstatProbe
from tuned_rl.measure.probes.tracefs import TracefsProbe, _parse


def feed(probe, lines, starts=None):
    tids, latencies, began = [], [], []
    for line in lines:
        probe._handle(_parse(line.encode()), tids, latencies, began)
    if starts is not None:
        starts += began
    return tids, latencies


def switch(ts, prev_pid, prev_state, next_pid):
    return (f"  python3-{prev_pid} [000] d..2. {ts}: sched_switch: prev_comm=python3 prev_pid={prev_pid} "
            f"prev_prio=120 prev_state={prev_state} ==> next_comm=x next_pid={next_pid} next_prio=120")


def wakeup(ts, pid, event="sched_wakeup"):
    return f"  <idle>-0 [001] dNh2. {ts}: {event}: comm=python3 pid={pid} prio=120 target_cpu=001"


def test_wakeup_to_switch_is_one_event_and_others_are_ignored():
    probe = TracefsProbe()
    probe._watched = {42}
    starts = []
    tids, latencies = feed(probe, [wakeup("100.000010", 42), wakeup("100.000011", 7),
                                   switch("100.000050", 0, "R", 7), switch("100.000110", 0, "R", 42)], starts)
    assert tids == [42] and latencies == [100_000]
    assert starts == [100_000_010_000]  # began at the wakeup, in ns of the instance's "mono" clock


def test_a_preempted_thread_is_timed_until_it_runs_again():
    probe = TracefsProbe()
    probe._watched = {42}
    _, latencies = feed(probe, [switch("5.000000", 42, "R+", 9), switch("5.002000", 9, "S", 42),
                                switch("5.003000", 42, "S", 0), switch("5.004000", 0, "R", 42)])
    assert latencies == [2_000_000]  # the sleep (S) at 5.003 is not run-queue wait


def test_threads_forked_by_a_watched_thread_are_watched():
    probe = TracefsProbe()
    probe._watched = {42}
    probe._set_filters = lambda: None
    fork = "  python3-42 [000] ..... 1.0: sched_process_fork: comm=python3 pid=42 child_comm=python3 child_pid=43"
    tids, _ = feed(probe, [fork, wakeup("1.1", 43, "sched_wakeup_new"), switch("1.2", 0, "R", 43)])
    assert tids == [43]


def test_schedstat_probe_reads_whole_records_and_keeps_a_partial_one():
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as reader:
        probe = SchedstatProbe(reader)
        data = RECORD.pack(5, 1000, 10_000) + RECORD.pack(6, 2000, 20_000)
        os.write(write_end, data + RECORD.pack(7, 3000, 30_000)[:5])
        waits = probe.drain()
        assert waits.tids.tolist() == [5, 6] and waits.latencies.tolist() == [1000, 2000]
        assert waits.starts.tolist() == [9_000, 18_000]  # woke at 10 and 20 µs, after waiting 1 and 2
        os.write(write_end, RECORD.pack(7, 3000, 30_000)[5:])
        assert probe.drain().latencies.tolist() == [3000]
        os.close(write_end)
        assert probe.lost == 0


def test_events_are_paired_in_timestamp_order_whatever_order_they_are_read_in(monkeypatch):
    probe = TracefsProbe()
    probe._watched = {42}
    lines = [switch("100.000110", 0, "R", 42), wakeup("100.000010", 42)]  # the switch was committed first
    probe._read_lines = lambda: [line.encode() for line in lines]
    monkeypatch.setattr("tuned_rl.measure.probes.tracefs.time.monotonic", lambda: 200.0)
    waits = probe.drain()
    assert waits.latencies.tolist() == [100_000] and waits.starts.tolist() == [100_000_010_000]


def test_events_newer_than_the_reorder_horizon_wait_for_the_next_drain(monkeypatch):
    probe = TracefsProbe()
    probe._watched = {42}
    lines = [wakeup("100.000010", 42), switch("100.000110", 0, "R", 42)]
    probe._read_lines = lambda: [line.encode() for line in lines]
    monkeypatch.setattr("tuned_rl.measure.probes.tracefs.time.monotonic", lambda: 100.01)
    assert probe.drain().latencies.tolist() == []
    lines.clear()
    monkeypatch.setattr("tuned_rl.measure.probes.tracefs.time.monotonic", lambda: 100.1)
    assert probe.drain().latencies.tolist() == [100_000]


def test_a_wakeup_whose_switch_never_arrives_is_counted_lost():
    probe = TracefsProbe()
    probe._watched = {42}
    tids, _ = feed(probe, [wakeup("1.0", 42), switch("1.5", 42, "S", 0),  # ran: the switch in went missing
                           wakeup("2.0", 42), wakeup("2.1", 42), switch("2.2", 0, "R", 42)])
    assert tids == [42] and probe._unpaired == 2


def test_bpf_events_are_copied_raw_and_decoded_when_taken_past_the_buffer_capacity():
    import ctypes

    from tuned_rl.measure.probes.bpf import EventBuffer, _Event

    buffer = EventBuffer(capacity=4)
    sent = [(100 + i, 1000 * i + 7, 5_000_000 + i) for i in range(10)]  # 10 events: two full buffers and a part
    for tid, delta, start in sent:
        event = _Event(tid=tid, pad=0, delta_ns=delta, start_ns=start)
        buffer.add(ctypes.addressof(event))
    waits = buffer.take()
    assert list(zip(waits.tids.tolist(), waits.latencies.tolist(), waits.starts.tolist())) == sent
    assert waits.tids.dtype == waits.latencies.dtype == waits.starts.dtype == "int64"
    assert len(buffer.take()) == 0  # taken once


# Lines as this kernel's trace_pipe printed them, from tasks that named themselves (prctl PR_SET_NAME).
HIDING_NAME = ("  1.1: sched_q: -16777   [001] dN.5. 23622.508865: sched_wakeup: comm=python3 pid=16735 prio=120 "
               "target_cpu=001")


def test_a_task_name_that_looks_like_a_line_header_hides_no_wakeup():
    assert _parse(HIDING_NAME.encode()) == (23622.508865, "sched_wakeup", {
        "comm": "python3", "pid": "16735", "prio": "120", "target_cpu": "001"})


def test_a_task_name_holding_field_text_fakes_no_preemption():
    # The thread switched out sleeping (S); the task switched in calls itself "x prev_state=R".
    line = ("  python3-42 [000] d..2. 7.000000: sched_switch: prev_comm=python3 prev_pid=42 prev_prio=120 "
            "prev_state=S ==> next_comm=x prev_state=R next_pid=9 next_prio=120")
    assert _parse(line.encode())[2]["prev_state"] == "S"
    probe = TracefsProbe()
    probe._watched = {42}
    _, latencies = feed(probe, [line, switch("7.001000", 9, "S", 42)])
    assert latencies == []  # asleep is not waiting: nothing to time


def test_names_with_arrows_equals_and_spaces_parse_as_the_fields_they_are():
    line = ("  a ==> next_comm-7 [001] d..2. 9.5: sched_switch: prev_comm=a ==> next_comm prev_pid=7 prev_prio=120 "
            "prev_state=R+ ==> next_comm=next_pid=1 x next_pid=8 next_prio=100")
    assert _parse(line.encode())[2] == {"prev_comm": "a ==> next_comm", "prev_pid": "7", "prev_prio": "120",
                                        "prev_state": "R+", "next_comm": "next_pid=1 x", "next_pid": "8",
                                        "next_prio": "100"}
    fork = "  p-1 [000] ..... 1.0: sched_process_fork: comm=child_pid=5 pid=1 child_comm=pid=3 child_pid=2"
    assert _parse(fork.encode())[2] == {"comm": "child_pid=5", "pid": "1", "child_comm": "pid=3", "child_pid": "2"}
    assert _parse(b"  p-1 [000] ..... 1.0: sched_switch: prev_comm=this name is far too long prev_pid=1") is None
