"""The fleet judge: a profile's treated nodes against untreated ones of the same kind, on the same
hours, from each node's run-queue latency histogram as Prometheus stored it (watch's /metrics)."""
