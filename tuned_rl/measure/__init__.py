"""Measuring a workload's run-queue latency (probes, canary, targets) and judging before against after."""
