"""quorumqueue's bundled broker: AMQP 0-9-1 server, queues, routing, storage."""

__version__ = "0.1.0"
