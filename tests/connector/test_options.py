"""Source options (connector/options.py): every rule, as tables.

Spark hands a data source its options as strings under case-insensitive keys; an
unknown key or an impossible value must stop the query at start with a message that
names the option.
"""

from __future__ import annotations

import pytest

from quorumqueue.connector.options import (BatchReadOptions, BrokerAddress, ConsumeLimits,
                                           Mode, OptionError, SourceOptions, consume_limits,
                                           parse_batch_read_options, parse_read_options,
                                           parse_source_options)

URI = "amqp://guest:guest@127.0.0.1:5672/%2F"
BASE = {"uri": URI, "queue": "orders"}


def parse(**extra) -> SourceOptions:
    return parse_source_options({**BASE, **extra})


def test_defaults():
    assert parse_source_options(BASE) == SourceOptions(
        addresses=(BrokerAddress(URI, "127.0.0.1", 5672, "/"),),
        queues=("orders",), mode=None, max_messages_per_trigger=None,
        max_bytes_per_trigger=None, prefetch=None, lease_timeout_ms=None,
        include_headers=True, fail_on_data_loss=True, release_lease_on_stop=False)


def test_option_names_are_case_insensitive():
    options = parse_source_options({"URI": URI, "Queue": "orders",
                                    "maxmessagespertrigger": "5", "MAXBYTESPERTRIGGER": "1k",
                                    "LeaseTimeout": "1s", "includeheaders": "false",
                                    "FAILONDATALOSS": "false", "PREFETCH": "7", "MODE": "lease"})
    assert (options.max_messages_per_trigger, options.max_bytes_per_trigger,
            options.lease_timeout_ms, options.include_headers, options.fail_on_data_loss,
            options.prefetch, options.mode) == (5, 1024, 1000, False, False, 7, Mode.LEASE)


@pytest.mark.parametrize("options, named", [
    ({"queue": "q"}, "'uri' is required"),
    ({"uri": URI}, "'queue' is required"),
    ({"uri": " ", "queue": "q"}, "'uri' is required"),
    ({**BASE, "maxMessagesPerTriger": "5"}, "unknown option 'maxMessagesPerTriger'"),
    ({**BASE, "subscribe": "orders"}, "unknown option 'subscribe'"),
    ({**BASE, "path": "/tmp"}, "unknown option 'path'"),
    ({**BASE, "MaxBytesPerTrigger": "1", "maxbytespertrigger": "2"},
     "'maxBytesPerTrigger' is given twice"),
])
def test_missing_unknown_and_duplicated_options_are_refused(options, named):
    with pytest.raises(OptionError, match=named):
        parse_source_options(options)


def test_an_unknown_option_suggests_the_close_one_and_lists_the_known():
    with pytest.raises(OptionError) as error:
        parse(maxMessagesPerTriger="5")
    assert "did you mean 'maxMessagesPerTrigger'?" in str(error.value)
    assert "known options: uri, queue, mode" in str(error.value)


def test_the_same_option_twice_with_the_same_value_is_fine():
    assert parse_source_options({**BASE, "Queue": "orders"}).queues == ("orders",)


# ------------------------------------------------------------------ uri


@pytest.mark.parametrize("uri, host, port, vhost", [
    ("amqp://guest:guest@127.0.0.1:5672/%2F", "127.0.0.1", 5672, "/"),
    ("amqp://localhost", "localhost", 5672, "/"),
    ("amqp://localhost/", "localhost", 5672, "/"),
    ("amqp://u:p@h:1234/sales", "h", 1234, "sales"),
    ("amqp://h/sales%2Feu", "h", 5672, "sales/eu"),
    ("amqps://h", "h", 5671, "/"),
    ("amqp://h/%2F?heartbeat=30", "h", 5672, "/"),
])
def test_uri_forms(uri, host, port, vhost):
    (address,) = parse(uri=uri).addresses
    assert (address.uri, address.host, address.port, address.vhost) == (uri, host, port, vhost)


def test_several_uris_are_the_nodes_of_a_cluster_tried_in_order():
    options = parse(uri="amqp://a:5672/%2F, amqp://b:5673/%2F,amqp://c/")
    assert [(a.host, a.port) for a in options.addresses] == [("a", 5672), ("b", 5673),
                                                             ("c", 5672)]
    assert options.vhost == "/"


@pytest.mark.parametrize("uri, complaint", [
    ("http://h/", "not an amqp:// or amqps:// URI"),
    ("h:5672", "not an amqp:// or amqps:// URI"),
    ("amqp:///%2F", "has no host"),
    ("amqp://h:99999/", "invalid port"),
    ("amqp://h:0/", "invalid port"),
    ("amqp://h:port/", "invalid port"),
    ("amqp://h/a/b", "must be written %2F"),
    ("amqp://h/?bogus=1", "Unknown URL parameter"),
    ("amqp://a/x,amqp://b/y", "same virtual host"),
    ("amqp://a/,,amqp://b/", "empty entry"),
])
def test_bad_uris_are_refused_naming_the_option(uri, complaint):
    with pytest.raises(OptionError, match="option 'uri'") as error:
        parse(uri=uri)
    assert complaint in str(error.value)


def test_messages_never_show_the_password():
    with pytest.raises(OptionError) as error:
        parse(uri="amqp://alice:s3cret@h:99999/")
    assert "s3cret" not in str(error.value) and "alice:***@h:99999" in str(error.value)
    with pytest.raises(OptionError) as error:
        parse(uri="amqp://alice:s3cret@h/,")
    assert "s3cret" not in str(error.value)
    assert parse(uri="amqp://alice:s3cret@h/").addresses[0].redacted == "amqp://alice:***@h/"


# ------------------------------------------------------------------ queue


@pytest.mark.parametrize("value, queues", [
    ("orders", ("orders",)),
    ("orders, returns ,audit", ("orders", "returns", "audit")),
    ("amq.gen-x", ("amq.gen-x",)),
])
def test_one_or_more_queues(value, queues):
    assert parse(queue=value).queues == queues


@pytest.mark.parametrize("value, complaint", [
    ("a,,b", "empty queue name"),
    ("a, ", "empty queue name"),
    ("a,b,a", "names 'a' more than once"),
    ("x" * 256, "longer than 255 bytes"),
])
def test_bad_queue_lists_are_refused(value, complaint):
    with pytest.raises(OptionError, match="option 'queue'") as error:
        parse(queue=value)
    assert complaint in str(error.value)


# ------------------------------------------------------------------ mode


@pytest.mark.parametrize("value, mode", [("lease", Mode.LEASE), ("consume", Mode.CONSUME),
                                         ("LEASE", Mode.LEASE), (" consume ", Mode.CONSUME)])
def test_mode(value, mode):
    assert parse(mode=value).mode is mode


def test_an_unknown_mode_is_refused():
    with pytest.raises(OptionError, match="option 'mode' must be 'lease'.*got 'stream'"):
        parse(mode="stream")


# ------------------------------------------------------------------ numbers and sizes


@pytest.mark.parametrize("value, expected", [("1", 1), ("1000", 1000), (" 7 ", 7),
                                             ("4294967295", 4294967295)])
def test_max_messages_per_trigger(value, expected):
    assert parse(maxMessagesPerTrigger=value).max_messages_per_trigger == expected


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "ten", "", "1e3", "4294967296"])
def test_bad_max_messages_per_trigger(value):
    with pytest.raises(OptionError, match="option 'maxMessagesPerTrigger'"):
        parse(maxMessagesPerTrigger=value)


@pytest.mark.parametrize("value, expected", [
    ("1", 1), ("100b", 100), ("1k", 1024), ("1kb", 1024), ("64m", 64 << 20),
    ("64MB", 64 << 20), ("2g", 2 << 30), ("1t", 1 << 40), ("10 k", 10240),
])
def test_max_bytes_per_trigger_takes_spark_byte_strings(value, expected):
    assert parse(maxBytesPerTrigger=value).max_bytes_per_trigger == expected


@pytest.mark.parametrize("value", ["0", "0k", "-1", "1.5m", "64mib", "lots", "m"])
def test_bad_max_bytes_per_trigger(value):
    with pytest.raises(OptionError, match="option 'maxBytesPerTrigger'"):
        parse(maxBytesPerTrigger=value)


@pytest.mark.parametrize("value, expected", [("1", 1), ("2000", 2000), ("65535", 65535)])
def test_prefetch(value, expected):
    assert parse(prefetch=value).prefetch == expected


@pytest.mark.parametrize("value, complaint", [("0", "positive integer"),
                                              ("65536", "at most 65535"),
                                              ("many", "positive integer")])
def test_bad_prefetch(value, complaint):
    with pytest.raises(OptionError, match="option 'prefetch'") as error:
        parse(prefetch=value)
    assert complaint in str(error.value)


@pytest.mark.parametrize("value, ms", [
    ("0", 0), ("never", 0), ("NONE", 0), ("250", 250), ("250ms", 250), ("30s", 30_000),
    ("10m", 600_000), ("10min", 600_000), ("2h", 7_200_000), ("1d", 86_400_000),
    ("5 s", 5000),
])
def test_lease_timeout_takes_spark_durations(value, ms):
    assert parse(leaseTimeout=value).lease_timeout_ms == ms


@pytest.mark.parametrize("value", ["-1s", "1.5h", "10 minutes", "soon", "s"])
def test_bad_lease_timeout(value):
    with pytest.raises(OptionError, match="option 'leaseTimeout'"):
        parse(leaseTimeout=value)


@pytest.mark.parametrize("option, field", [("includeHeaders", "include_headers"),
                                           ("failOnDataLoss", "fail_on_data_loss"),
                                           ("releaseLeaseOnStop", "release_lease_on_stop")])
@pytest.mark.parametrize("value, expected", [("true", True), ("false", False),
                                             ("TRUE", True), (" False ", False)])
def test_booleans(option, field, value, expected):
    assert getattr(parse(**{option: value}), field) is expected


@pytest.mark.parametrize("option", ["includeHeaders", "failOnDataLoss", "releaseLeaseOnStop"])
@pytest.mark.parametrize("value", ["yes", "1", "", "on"])
def test_bad_booleans(option, value):
    with pytest.raises(OptionError, match=f"option '{option}' must be true or false"):
        parse(**{option: value})


# ------------------------------------------------------------------ consume mode's prefetch


@pytest.mark.parametrize("extra, limits", [
    ({}, ConsumeLimits(10_000, 4_999)),                           # defaults
    ({"prefetch": "101"}, ConsumeLimits(101, 50)),                 # batches from prefetch
    ({"prefetch": "3"}, ConsumeLimits(3, 1)),
    ({"maxMessagesPerTrigger": "10"}, ConsumeLimits(30, 10)),      # prefetch from batches
    ({"maxMessagesPerTrigger": "30000"}, ConsumeLimits(65535, 30000)),
    ({"maxMessagesPerTrigger": "32767"}, ConsumeLimits(65535, 32767)),
    ({"maxMessagesPerTrigger": "10", "prefetch": "21"}, ConsumeLimits(21, 10)),
])
def test_consume_prefetch_exceeds_two_batches(extra, limits):
    assert consume_limits(parse(**extra)) == limits
    assert limits.prefetch > 2 * limits.max_batch_messages


@pytest.mark.parametrize("extra, complaint", [
    ({"maxMessagesPerTrigger": "10", "prefetch": "20"},
     "option 'prefetch' (20) must exceed two batches of option 'maxMessagesPerTrigger' (10)"
     ", or the query stalls waiting for acks that come one batch later; set 'prefetch' to "
     "at least 21"),
    ({"maxMessagesPerTrigger": "32768"},
     "option 'maxMessagesPerTrigger' must be at most 32767 in consume mode, got 32768: "
     "option 'prefetch' must exceed two batches"),
    ({"prefetch": "2"}, "option 'prefetch' must be at least 3 in consume mode"),
])
def test_a_prefetch_too_small_for_the_batches_is_refused_naming_both(extra, complaint):
    with pytest.raises(OptionError) as error:
        consume_limits(parse(**extra))
    assert complaint in str(error.value)


# ------------------------------------------------------------------ batch reads


def test_batch_read_defaults():
    assert parse_batch_read_options({**BASE, "maxMessages": "50"}) == BatchReadOptions(
        addresses=(BrokerAddress(URI, "127.0.0.1", 5672, "/"),), queues=("orders",),
        mode=None, max_messages=50, peek=False, include_headers=True)
    options = parse_batch_read_options({**BASE, "MAXMESSAGES": "5", "Peek": "true",
                                        "mode": "consume", "includeHeaders": "false"})
    assert (options.max_messages, options.peek, options.mode, options.include_headers) == (
        5, True, Mode.CONSUME, False)


@pytest.mark.parametrize("options, complaint", [
    (BASE, "option 'maxMessages' is required for a batch read"),
    ({**BASE, "maxMessages": "0"}, "option 'maxMessages' must be a positive integer"),
    ({**BASE, "maxMessages": "4294967296"}, "option 'maxMessages' must be at most"),
    ({**BASE, "maxMessages": "5", "peek": "yes"}, "option 'peek' must be true or false"),
    ({**BASE, "maxMessages": "5", "prefetch": "10"},
     "option 'prefetch' is an option of streaming reads (spark.readStream); a batch read "
     "takes 'maxMessages' (required) and 'peek'"),
    ({**BASE, "maxMessages": "5", "releaseleaseonstop": "true"},
     "option 'releaseLeaseOnStop' is an option of streaming reads"),
    ({**BASE, "maxMessages": "5", "maxMesages": "5"}, "did you mean 'maxMessages'?"),
])
def test_bad_batch_read_options_are_named(options, complaint):
    with pytest.raises(OptionError) as error:
        parse_batch_read_options(options)
    assert complaint in str(error.value)


@pytest.mark.parametrize("extra, named", [({"maxMessages": "5"}, "maxMessages"),
                                          ({"PEEK": "true"}, "peek")])
def test_a_stream_refuses_the_batch_read_options(extra, named):
    with pytest.raises(OptionError, match=f"option '{named}' is an option of batch reads"):
        parse(**extra)


def test_load_checks_the_options_of_whichever_read_they_belong_to():
    assert isinstance(parse_read_options({**BASE, "maxMessages": "5"}), BatchReadOptions)
    assert isinstance(parse_read_options({**BASE, "prefetch": "5"}), SourceOptions)
    with pytest.raises(OptionError, match="option 'maxMessages' must be a positive"):
        parse_read_options({**BASE, "maxMessages": "none"})


# ------------------------------------------------------------------ Kafka-like options
# connector/README.md, "Coming from Kafka: options and columns".


def test_the_kafka_like_options_default_to_off():
    options = parse()
    assert (options.queue_pattern, options.min_messages_per_trigger,
            options.max_trigger_delay_ms, options.min_partitions,
            options.max_messages_per_partition) == (None, None, 0, None, None)


def test_queue_pattern_is_a_regular_expression_instead_of_names():
    options = parse_source_options({"uri": URI, "queuePattern": r"orders\..*"})
    assert options.queues == () and options.queue_pattern.pattern == r"orders\..*"
    assert options.queue_pattern.fullmatch("orders.eu")
    assert not options.queue_pattern.fullmatch("archive.orders.eu")


@pytest.mark.parametrize("options, complaint", [
    ({"uri": URI, "queue": "orders", "queuePattern": "orders.*"},
     "options 'queue' and 'queuePattern' cannot be used together: name the queues with "
     "'queue', or match them with 'queuePattern', not both"),
    ({"uri": URI}, "option 'queue' is required (or 'queuePattern', a regular expression "
                   "matching the queues to read)"),
    ({"uri": URI, "queuePattern": "orders.(["},
     "option 'queuePattern' is not a valid regular expression"),
    ({"uri": URI, "queuePattern": " "},
     "option 'queuePattern' is required to be a non-empty regular expression"),
    ({"uri": URI, "queuePattern": "orders.*", "mode": "consume"},
     "option 'queuePattern' needs lease mode"),
])
def test_bad_queue_patterns_are_refused_naming_the_options(options, complaint):
    with pytest.raises(OptionError) as error:
        parse_source_options(options)
    assert complaint in str(error.value)


@pytest.mark.parametrize("extra, expected", [
    ({"minMessagesPerTrigger": "100"}, (100, 15 * 60 * 1000)),   # Kafka's default delay
    ({"minMessagesPerTrigger": "100", "maxTriggerDelay": "30s"}, (100, 30_000)),
    ({"minMessagesPerTrigger": "5", "maxTriggerDelay": "2m", "maxMessagesPerTrigger": "5"},
     (5, 120_000)),
])
def test_min_messages_per_trigger_with_max_trigger_delay(extra, expected):
    options = parse(**extra)
    assert (options.min_messages_per_trigger, options.max_trigger_delay_ms) == expected


@pytest.mark.parametrize("extra, complaint", [
    ({"maxTriggerDelay": "30s"},
     "option 'maxTriggerDelay' only applies with option 'minMessagesPerTrigger'"),
    ({"minMessagesPerTrigger": "0"}, "option 'minMessagesPerTrigger' must be a positive"),
    ({"minMessagesPerTrigger": "many"}, "option 'minMessagesPerTrigger' must be a positive"),
    ({"minMessagesPerTrigger": "11", "maxMessagesPerTrigger": "10"},
     "option 'minMessagesPerTrigger' (11) is above option 'maxMessagesPerTrigger' (10): no "
     "batch could satisfy both"),
    ({"minMessagesPerTrigger": "5", "maxTriggerDelay": "0"},
     "option 'maxTriggerDelay' must be a positive duration"),
    ({"minMessagesPerTrigger": "5", "maxTriggerDelay": "never"},
     "option 'maxTriggerDelay' must be a positive duration"),
    ({"minMessagesPerTrigger": "5", "maxTriggerDelay": "soon"},
     "option 'maxTriggerDelay' must be a duration such as 30s"),
])
def test_bad_trigger_minimums_are_refused_naming_the_options(extra, complaint):
    with pytest.raises(OptionError) as error:
        parse(**extra)
    assert complaint in str(error.value)


@pytest.mark.parametrize("option, field", [("minPartitions", "min_partitions"),
                                           ("maxMessagesPerPartition",
                                            "max_messages_per_partition")])
def test_partition_options(option, field):
    assert getattr(parse(**{option: "8"}), field) == 8
    for bad in ("0", "-2", "eight", "1.5"):
        with pytest.raises(OptionError, match=f"option '{option}' must be a positive integer"):
            parse(**{option: bad})


@pytest.mark.parametrize("option", ["queuePattern", "minMessagesPerTrigger", "maxTriggerDelay",
                                    "minPartitions", "maxMessagesPerPartition"])
def test_a_batch_read_refuses_the_streaming_options(option):
    with pytest.raises(OptionError, match=f"option '{option}' is an option of streaming reads"):
        parse_batch_read_options({**BASE, "maxMessages": "5", option: "1"})
