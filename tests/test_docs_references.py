"""The repository stands alone: no file refers to a document outside it, every relative link in
its Markdown reaches a file of the repository (and a heading there, when it names one), and
every ``docs/<page>.md#heading`` a comment cites names a heading of that page."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

OUTSIDE = (
    re.compile("DESIGN" + r"(\.md| §)"),
    re.compile("/work/" + "shared"),
    re.compile("STYLE" + r"\.md"),
)
"""References to the team's documents outside the repository (spelt so as not to match here)."""
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"\b(docs/[\w-]+\.md)#([\w-]+)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    return [ROOT / name for name in names if name and (ROOT / name).is_file()]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def prose(text: str) -> Iterator[tuple[int, str]]:
    """The lines of a Markdown text outside fenced code blocks, numbered from 1."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for _, line in prose(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(1))
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def test_slugs_follow_githubs_rules() -> None:
    assert slug("9. Speed: what one loopback hop costs") == "9-speed-what-one-loopback-hop-costs"
    assert slug("lupine versions and a pod's CUDA major") == "lupine-versions-and-a-pods-cuda-major"
    assert slug("Fifth round: the floor under `/filter`") == "fifth-round-the-floor-under-filter"


def test_no_file_refers_to_a_document_outside_the_repository() -> None:
    found = []
    for path in tracked():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if any(pattern.search(line) for pattern in OUTSIDE):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "point these at a page under docs/ instead:\n" + "\n".join(found)


def _broken_link(page: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return None  # a URL
    path_part, _, anchor = target.partition("#")
    destination = (page.parent / path_part).resolve() if path_part else page
    if not destination.exists():
        return "no such file"
    if not destination.is_relative_to(ROOT):
        return "outside the repository"
    if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
        return f"no heading #{anchor} in {destination.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize(
    "page",
    [p for p in tracked() if p.suffix == ".md"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_relative_link_reaches_a_file_and_heading_of_the_repository(page: Path) -> None:
    broken = []
    for number, line in prose(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            why = _broken_link(page, target)
            if why is not None:
                broken.append(f"{page.relative_to(ROOT)}:{number}: ({target}): {why}")
    assert not broken, "\n".join(broken)


def test_every_cited_docs_heading_exists() -> None:
    broken = []
    for path in tracked():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for page, anchor in CITED.findall(line):
                target = ROOT / page
                if not target.is_file() or anchor not in anchors(target):
                    broken.append(f"{path.relative_to(ROOT)}:{number}: {page}#{anchor}")
    assert not broken, "no such page or heading:\n" + "\n".join(broken)
