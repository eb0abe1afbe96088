"""Dynamic shovels (RabbitMQ's shovel plugin, its runtime-parameter form): move
messages from a queue or exchange of one AMQP 0-9-1 server to another, inside the
broker. A client of AMQP servers (aiormq), knowing nothing of the node: the server
shell starts it and feeds it the `shovel` runtime parameters (README.md)."""
