"""diagnose: who the workload waits behind, which seed cause is present, and a profile that fixes it."""
