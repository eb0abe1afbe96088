"""The broker's way in stays short and true: broker/README.md fits in 300 lines and
opens with a map of at most eight stops, each a file that exists; every topic file
under docs/behaviour/ names the guide sections it follows, and the index lists it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "broker" / "README.md"
BEHAVIOUR = ROOT / "docs" / "behaviour"


def test_the_broker_readme_is_at_most_300_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_the_map_has_at_most_eight_stops_each_an_existing_file():
    text = README.read_text(encoding="utf-8")
    map_block = text.split("## One message, eight stops", 1)[1].split("```")[1]
    stops = re.findall(r"^\d+\. (\S+)", map_block, flags=re.M)
    assert 1 <= len(stops) <= 8, stops
    missing = [stop for stop in stops if not (ROOT / "broker" / stop).is_file()]
    assert not missing, missing


def test_every_behaviour_topic_cites_its_seed_sections_and_is_listed():
    index = (BEHAVIOUR / "README.md").read_text(encoding="utf-8")
    topics = sorted(path for path in BEHAVIOUR.glob("*.md") if path.name != "README.md")
    assert topics
    for path in topics:
        lines = path.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# "), path.name
        assert lines[2].startswith("Seed: "), f"{path.name}: no 'Seed:' line"
        assert f"`{path.name}`" in index, f"{path.name} is not in docs/behaviour/README.md"
        assert f"`{path.name}`" in README.read_text(encoding="utf-8"), \
            f"{path.name} is not in broker/README.md's table"
