"""The core loop: plugins plan steps; each step is journaled, written, read back, verified, and kept or reverted."""
