"""Test helpers (tiny random checkpoints)."""
