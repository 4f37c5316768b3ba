"""The documents: the README stays an entry page, every relative link in the documents leads to a file, and the
settings table is the one labkit.settings writes."""

import re
from pathlib import Path

import pytest

from labkit import settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and ![alt](target), the target up to a space (a title may follow) or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def _links(text: str) -> list[str]:
    text = CODE.sub("", FENCE.sub("", text))  # links are not read inside code
    return LINK.findall(text)


def test_the_readme_is_an_entry_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move the details into docs/ or CONTRIBUTING.md"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 300]
    assert not long, f"README.md lines over 300 characters: {long}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_relative_link_leads_to_a_file(doc):
    broken = []
    for target in _links(doc.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http(s), mailto and the like; an anchor in the same page
        path = target.split("#", 1)[0].split("?", 1)[0]
        found = (doc.parent / path).resolve()
        if not found.exists() or not found.is_relative_to(ROOT):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to what is not in the repository: {broken}"


def test_the_documents_list_every_setting():
    instructors = (ROOT / "docs" / "instructors.md").read_text()
    assert settings.table() in instructors, "docs/instructors.md's settings table differs from labkit.settings.table()"
