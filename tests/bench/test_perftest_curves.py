"""The sweep's grid, pair order, per-pair ratios, CSV and plots (bench/perftest_curves.py,
bench/perftest.py); pure, no broker, no Java."""

import csv

from bench import perftest, perftest_curves


def run(receiving: float, p99_us: float, repeat: int) -> dict:
    return {"sending": receiving, "receiving": receiving, "repeat": repeat, "load1": 2.0,
            "latency_us": {"min": 1.0, "median": p99_us / 2, "75th": p99_us / 2,
                           "95th": p99_us, "99th": p99_us}}


def rows_of(scenario: perftest.Scenario, ours: list[dict], theirs: list[dict], nodes: int = 1) -> list[dict]:
    return [perftest_curves.summary_row(nodes, scenario, "quorumqueue", 10, 3, ours, []),
            perftest_curves.summary_row(nodes, scenario, "rabbitmq", 10, 3, theirs, [])]


def test_the_grid_is_sizes_on_one_queue_then_queue_counts_most_queues_last_each_point_once() -> None:
    names = [s.name for s in perftest_curves.grid([1, 10, 100], [16, 1024, 65536, 1048576])]
    assert names == ["1q-16b", "1q-1kb", "1q-64kb", "1q-1mib", "10q-1kb", "100q-1kb"]


def test_pairs_alternate_which_broker_runs_first() -> None:
    targets = ["quorumqueue", "rabbitmq"]
    assert [perftest_curves.pair_order(r, targets)[0] for r in range(3)] == \
        ["quorumqueue", "rabbitmq", "quorumqueue"]


def test_ratios_pair_runs_of_the_same_repeat_and_skip_a_pair_with_a_failed_run() -> None:
    scenario = perftest.Scenario("1q-1kb", 1, 1024)
    # RabbitMQ's pair 1 failed: its pair makes no ratio; the others pair by repeat, not position
    rows = rows_of(scenario, [run(100, 10, 0), run(300, 30, 1), run(200, 40, 2)],
                   [run(50, 20, 0), run(100, 10, 2)])
    assert perftest.pair_ratios(rows, "receiving") == {(1, "1q-1kb"): [2.0, 2.0]}
    assert perftest.pair_ratios(rows, "latency_p99_us") == {(1, "1q-1kb"): [0.5, 4.0]}


def test_old_rows_without_repeat_numbers_pair_by_position() -> None:
    scenario = perftest.Scenario("1q-16b", 1, 16)
    old = [{k: v for k, v in run(100, 10, 0).items() if k != "repeat"}]
    rows = rows_of(scenario, old, [{**old[0], "receiving": 400.0}])
    assert perftest.pair_ratios(rows, "receiving") == {(1, "1q-16b"): [0.25]}


def test_csv_has_a_line_per_run_and_the_pairs_ratios_on_quorumqueues_lines(tmp_path) -> None:
    scenario = perftest.Scenario("10q-1kb", 10, 1024)
    rows = rows_of(scenario, [run(300, 30, 0), run(100, 10, 1)], [run(100, 60, 0), run(200, 5, 1)], nodes=3)
    perftest_curves.write_outputs(rows, tmp_path)
    with (tmp_path / "perftest_curves.csv").open() as handle:
        lines = list(csv.DictReader(handle))
    assert [(line["target"], line["pair"], line["recv_ratio_pair"], line["p99_ratio_pair"]) for line in lines] == [
        ("quorumqueue", "0", "3.0", "0.5"), ("quorumqueue", "1", "0.5", "2.0"),
        ("rabbitmq", "0", "", ""), ("rabbitmq", "1", "", "")]
    assert {line["nodes"] for line in lines} == {"3"}


def test_plots_are_written_per_node_count_and_axis(tmp_path) -> None:
    rows = []
    for scenario in perftest_curves.grid([1, 10], [16]):
        rows += rows_of(scenario, [run(100, 10, 0)], [run(50, 20, 0)])
    paths = perftest.plot(rows, tmp_path, prefix="curves", subtitle=lambda nodes: f"{nodes} test")
    assert sorted(p.name for p in paths) == ["curves_1n_by_queues.png", "curves_1n_by_size.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)


def test_the_table_gives_median_and_range_and_the_median_pair_ratio() -> None:
    scenario = perftest.Scenario("1q-1kb", 1, 1024)
    rows = rows_of(scenario, [run(100, 10_000, 0), run(300, 30_000, 1), run(200, 20_000, 2)],
                   [run(100, 10_000, 0), run(100, 10_000, 1), run(100, 10_000, 2)])
    first = perftest_curves.table(rows).splitlines()[1]
    assert "200 (100-300)" in first and "2.00x" in first


def test_a_later_sweep_replaces_the_node_counts_it_measured() -> None:
    scenario = perftest.Scenario("1q-1kb", 1, 1024)
    first = rows_of(scenario, [run(1, 1, 0)], [run(1, 1, 0)], nodes=1) + \
        rows_of(scenario, [run(2, 2, 0)], [run(2, 2, 0)], nodes=3)
    second = rows_of(scenario, [run(3, 3, 0)], [run(3, 3, 0)], nodes=3)
    merged = perftest_curves.merge_runs([first, second])
    assert [(r["nodes"], r["receiving"]) for r in merged] == [(1, 1), (1, 1), (3, 3), (3, 3)]


def test_each_complete_pair_gives_its_mean_load_and_ratio() -> None:
    scenario = perftest.Scenario("1q-16b", 1, 16)
    ours = [{**run(300, 10, 0), "load1": 2.0}, {**run(100, 10, 1), "load1": 20.0}]
    theirs = [{**run(100, 10, 0), "load1": 4.0}]
    assert perftest_curves.pair_points(rows_of(scenario, ours, theirs)) == [(1, "1q-16b", 3.0, 3.0)]


def test_the_load_plot_pairs_runs_within_each_sweep(tmp_path, monkeypatch) -> None:
    scenario = perftest.Scenario("1q-16b", 1, 16)
    first = rows_of(scenario, [{**run(100, 10, 0), "load1": 20.0}], [{**run(200, 10, 0), "load1": 20.0}])
    second = rows_of(scenario, [{**run(300, 10, 0), "load1": 2.0}], [{**run(100, 10, 0), "load1": 2.0}])
    seen = []
    monkeypatch.setattr(perftest_curves, "pair_points",
                        lambda rows, real=perftest_curves.pair_points: seen.extend(real(rows)) or real(rows))
    perftest_curves.plot_ratio_against_load([first, second], tmp_path / "load.png")
    assert sorted(seen) == [(1, "1q-16b", 2.0, 3.0), (1, "1q-16b", 20.0, 0.5)]
    assert (tmp_path / "load.png").read_bytes().startswith(b"\x89PNG")


def test_clients_per_queue_are_an_axis_of_their_own_on_one_queue_at_1_kb() -> None:
    scenarios = perftest_curves.grid([1, 10], [16, 1024], [1, 10, 50])
    assert [s.name for s in scenarios] == ["1q-16b", "1q-1kb", "1q-1kb-10c", "1q-1kb-50c",
                                           "10q-1kb"]
    fifty = scenarios[3]
    command = perftest.perftest_command("amqp://x", fifty, 10, "tag")
    assert command[command.index("--producers") + 1] == "50"
    assert command[command.index("--consumers") + 1] == "50"
    assert command[command.index("--queue") + 1] == "tag-1"


def test_the_clients_plot_is_drawn_from_the_one_queue_points(tmp_path) -> None:
    rows = []
    for clients in (1, 10, 50):
        scenario = perftest.Scenario(perftest_curves.scenario_name(1, 1024, clients), 1, 1024,
                                     clients)
        rows += rows_of(scenario, [run(100 * clients, 10, 0)], [run(50 * clients, 20, 0)])
    paths = perftest.plot(rows, tmp_path, prefix="curves")
    assert [p.name for p in paths] == ["curves_1n_by_clients.png"]
    line = perftest_curves.csv_lines(rows)[-2]
    assert (line["clients"], line["recv_ratio_pair"]) == (50, 2.0)
