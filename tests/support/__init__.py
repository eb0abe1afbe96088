"""Helpers shared by tests and benchmarks (the RabbitMQ oracle node)."""
