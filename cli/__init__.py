"""The `quorumqueue` command line: a client of the bundled broker.

main.py (the `quorumqueue` group and `queues ...`), ctl.py (`ctl ...`, as
rabbitmqctl), cluster.py and launcher.py (`cluster start|status`),
definitions_transform.py (definitions files exported from RabbitMQ), http.py (one
management request turned into a click error, tables). Every command but `broker
start` talks to a running node through quorumqueue.client; `broker start` runs the
broker's own program (`python -m quorumqueue.broker start`) in its place.
"""
