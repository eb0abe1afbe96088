"""Tests of the benchmark tooling in bench/ (pure, no broker)."""
