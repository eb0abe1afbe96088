"""quorumqueue's client side: what a program needs to talk to the bundled broker.

The lease client (lease_client.py), the management RPC client (management.py),
the one delivery type every read returns (delivery.py), the decoder of packed lease
reads (lease_records.py), and the management HTTP API client (http_management.py).
The Spark connector, the jobs and the `quorumqueue` command (quorumqueue.cli) use
the broker through these only (README.md in this folder).
"""
