"""The throughput benchmark's command line, queue-type plumbing and report; pure, no broker.

The quorum queue declare follows RabbitMQ's quorum queue docs: `x-queue-type: quorum`
on a durable queue.
"""

import asyncio

import pytest
from pamqp import commands, frame

from bench import amqp_loadgen, amqp_throughput, amqp_wire as wire
from bench.amqp_loadgen import LoadError, LoadSettings, _Generator, declare_arguments


def row(target: str, publish: float, consume: float, queue_type: str = "quorum") -> dict:
    def phase(rate: float) -> dict:
        return {"messages": 1000, "wall_s": 1000 / rate, "generator_cpu_s": 100 / rate, "msgs_per_s": rate}

    return {"target": target, "queue_type": queue_type, "publish": phase(publish), "consume": phase(consume)}


def test_queue_type_defaults_to_classic_and_accepts_quorum() -> None:
    assert amqp_throughput.parse_arguments([]).queue_type == "classic"
    assert amqp_throughput.parse_arguments(["--queue-type", "quorum"]).queue_type == "quorum"


@pytest.mark.parametrize(
    "argv",
    [
        ["--queue-type", "stream"],
        ["--messages", "0"],
        ["--size", "7"],
        ["--prefetch", "65536"],
        ["--uri", "amqp://guest:guest@127.0.0.1:5672/%2F"],  # which broker is it?
    ],
)
def test_impossible_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        amqp_throughput.parse_arguments(argv)


def test_declare_arguments_per_queue_type() -> None:
    assert declare_arguments("classic") == {}
    assert declare_arguments("quorum") == {"x-queue-type": "quorum"}
    with pytest.raises(ValueError, match="queue type"):
        declare_arguments("stream")
    with pytest.raises(ValueError, match="queue_type"):
        LoadSettings("127.0.0.1", 0, queue_type="lazy")


def test_quorum_declare_is_durable_with_the_queue_type_argument() -> None:
    encoded = wire.queue_declare(1, "q", durable=True, arguments=declare_arguments("quorum"))
    _, channel, declare = frame.unmarshal(encoded)
    assert isinstance(declare, commands.Queue.Declare)
    assert (channel, declare.queue, declare.durable, declare.arguments) == (1, "q", True, {"x-queue-type": "quorum"})


def test_classic_declare_is_unchanged() -> None:
    assert wire.queue_declare(1, "q", durable=True) == wire.queue_declare(1, "q", durable=True, arguments={})
    _, _, declare = frame.unmarshal(wire.queue_declare(1, "q", durable=True))
    assert declare.arguments == {}


def test_table_names_the_queue_type_and_one_line_per_target() -> None:
    table = amqp_throughput.render_table([row("quorumqueue", 12_000, 30_000), row("rabbitmq", 20_000, 40_000)])
    lines = table.splitlines()
    assert lines[0] == "quorum queues"
    assert lines[3].split()[:3] == ["quorumqueue", "12,000", "30,000"]
    assert lines[4].split()[:3] == ["rabbitmq", "20,000", "40,000"]
    assert lines[3].split()[-3:] == ["10%", "/", "10%"]  # generator busy share


def test_rows_without_a_queue_type_are_classic() -> None:  # JSON from before --queue-type
    plain = row("rabbitmq", 1, 1)
    del plain["queue_type"]
    assert amqp_throughput.render_table([plain]).splitlines()[0] == "classic queues"


def test_ratios_need_both_targets() -> None:
    assert amqp_throughput.ratios([row("quorumqueue", 1, 1)]) is None
    assert amqp_throughput.ratios([row("quorumqueue", 12_000, 30_000), row("rabbitmq", 20_000, 40_000)]) == {
        "publish": 0.6,
        "consume": 0.75,
    }


@pytest.mark.parametrize(
    ("publish", "consume", "queue_type", "verdict"),
    [
        (1.2, 1.0, "quorum", "meets the >= 1.0x goal"),
        (0.6, 1.5, "quorum", "meets the >= 0.5x target, not the >= 1.0x goal"),
        (0.6, 1.5, "classic", "meets the >= 0.5x target"),
        (0.49, 2.0, "quorum", "MISSES the >= 0.5x target"),
    ],
)
def test_ratio_line_judges_the_worse_phase(publish: float, consume: float, queue_type: str, verdict: str) -> None:
    line = amqp_throughput.render_ratios({"publish": publish, "consume": consume}, queue_type)
    assert line.startswith(f"quorumqueue / rabbitmq ({queue_type} queues): publish {publish:.2f}x")
    assert line.endswith(f"({verdict})")


def test_an_unanswered_request_fails_the_run_instead_of_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    class SilentTransport:
        def write(self, data: bytes) -> None:
            pass

    async def ask() -> None:
        generator = _Generator(LoadSettings("127.0.0.1", 0))
        generator.transport = SilentTransport()  # type: ignore[assignment]
        await generator.call(1, wire.channel_open(1), wire.CHANNEL_OPEN_OK)

    monkeypatch.setattr(amqp_loadgen, "REPLY_TIMEOUT_S", 0.01)
    with pytest.raises(LoadError, match="no reply 20.11 on channel 1"):
        asyncio.run(ask())
