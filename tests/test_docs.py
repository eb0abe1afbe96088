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


# A citation of a document's section, as the code and the docs write it:
# `broker/cluster/README.md, "TLS between nodes"` (the comma is optional).
CITATION = re.compile(r'((?:[\w.-]+/)*[\w.-]+\.md),?\s+"([^"]+?)"')
SOURCES = ("broker", "cli", "client", "connector", "jobs", "tests", "bench", "docs", "conf")


def _texts():
    for path in sorted(ROOT.glob("*.md")):
        yield path
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".md") and path.is_file():
                yield path


def _document(cited: str, by: Path) -> Path | None:
    for candidate in (ROOT / cited, by.parent / cited):
        if candidate.is_file():
            return candidate
    named = [path for path in _texts() if path.as_posix().endswith("/" + cited)]
    return named[0] if len(named) == 1 else None


def _sections(document: Path) -> list[str]:
    """Its headings and the bold lead-ins of its paragraphs and items."""
    text = document.read_text(encoding="utf-8")
    heads = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
    return [" ".join(h.replace("`", "").split()) for h in
            heads + re.findall(r"\*\*([^*]+)\*\*", text)]


def test_every_cited_section_exists():
    """A moved section leaves no citation behind. Every citation in the code and
    docs (a .md file, then a section's name in quotes) names a file here. A heading
    (or a bold lead-in) of that file starts with the section's name."""
    stale = []
    for path in _texts():
        text = path.read_text(encoding="utf-8")
        for found in CITATION.finditer(text):
            cited, section = found.group(1), found.group(2)
            # a citation wrapped across comment lines: drop the `#`s between
            section = " ".join(re.sub(r"\n\s*#", " ", section).replace("`", "").split())
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, found.start()) + 1}"
            document = _document(cited, path)
            if document is None:
                stale.append(f"{where}: no file {cited}")
            elif not any(name.startswith(section) for name in _sections(document)):
                stale.append(f"{where}: no section {section!r} in {cited}")
    assert not stale, stale


def test_every_repository_path_named_in_the_docs_exists():
    """A path the code or the docs name (broker/..., docs/..., cli/..., a .py, .md
    or .toml file) is a file of the repository, from its root or the naming file's
    directory."""
    tops = "|".join(SOURCES)
    named = re.compile(rf"(?<![\w./-])((?:{tops})/(?:[\w-]+/)*[\w-]+\.(?:py|md|toml))\b")
    missing = []
    for path in _texts():
        text = path.read_text(encoding="utf-8")
        for found in named.finditer(text):
            cited = found.group(1)
            if not ((ROOT / cited).is_file() or (path.parent / cited).is_file()):
                line = text.count("\n", 0, found.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}: {cited}")
    assert not missing, missing
