"""The quorum-queue state machine (RabbitMQ's rabbit_fifo semantics), pure."""
