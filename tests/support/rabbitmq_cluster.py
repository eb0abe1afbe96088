"""A private cluster of RabbitMQ 3.10.8 nodes: the oracle for behaviour that needs
more than one node (a classic queue whose home node is down).

`RabbitMQCluster(size)` starts `size` RabbitMQNodes (rabbitmq.py) on loopback: the
first with its own epmd, the others registering with that epmd and holding the
first's Erlang cookie, each joined to the first with rabbitmqctl (stop_app,
join_cluster, start_app). `stop_node(i)` stops one (the others see it down);
`stop()` stops them all, the first (whose epmd the others use) last.

Not here: quorumqueue's clusters (cluster.py), anything RabbitMQ's own cluster
formation does beyond join_cluster.
"""

from __future__ import annotations

import time

from .rabbitmq import RabbitMQNode, RabbitMQNodeError


class RabbitMQCluster:
    def __init__(self, size: int = 2, join_timeout: float = 120.0, **node_options) -> None:
        self.size = size
        self.join_timeout = join_timeout
        self.node_options = node_options
        self.nodes: list[RabbitMQNode] = []

    def start(self) -> "RabbitMQCluster":
        try:
            first = RabbitMQNode(**self.node_options).start()
            self.nodes.append(first)
            for _ in range(self.size - 1):
                node = RabbitMQNode(cookie=first.erlang_cookie(), epmd=first,
                                    **self.node_options).start()
                self.nodes.append(node)
                for step in (("stop_app",), ("join_cluster", first.node_name)):
                    self._ctl(node, *step)
                # the AMQP port is bound again: what stop_app closed may linger a moment
                for attempt in range(10):
                    done = node.ctl("start_app")
                    if done.returncode == 0 or "could_not_start_listener" not in (
                            done.stdout + done.stderr) or attempt == 9:
                        break
                    time.sleep(1.0)
                if done.returncode != 0:
                    raise RabbitMQNodeError(f"rabbitmqctl start_app on {node.node_name}: "
                                            f"{done.stdout}{done.stderr}")
            self._wait_until_joined()
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _ctl(node: RabbitMQNode, *arguments: str) -> None:
        done = node.ctl(*arguments)
        if done.returncode != 0:
            raise RabbitMQNodeError(f"rabbitmqctl {' '.join(arguments)} on "
                                    f"{node.node_name}: {done.stdout}{done.stderr}")

    def _wait_until_joined(self) -> None:
        deadline = time.monotonic() + self.join_timeout
        first = self.nodes[0]
        while True:
            status = first.ctl("cluster_status", "--formatter", "json")
            if status.returncode == 0 and all(node.node_name in status.stdout
                                              for node in self.nodes) \
                    and status.stdout.count("@localhost") >= 2 * self.size:
                return
            if time.monotonic() > deadline:
                raise RabbitMQNodeError(f"the nodes did not form one cluster within "
                                        f"{self.join_timeout:g} s: {status.stdout}{status.stderr}")
            time.sleep(0.5)

    def stop_node(self, index: int) -> None:
        """Stop node `index` (not the first, whose epmd the others use)."""
        assert index > 0, "the first node's epmd serves the others: stop another"
        self.nodes[index].stop()

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        self.nodes = []

    def __enter__(self) -> "RabbitMQCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
