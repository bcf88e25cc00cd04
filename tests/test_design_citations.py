"""Every ``DESIGN.md, "<section>"`` a module cites names a heading of DESIGN.md (module docstrings
point there for their narratives)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r'DESIGN\.md,?\s*\(?\s*"([^"]+)"')


def citations() -> list[tuple[str, str]]:
    """(path, section) of every citation under memest/, whitespace folded (a citation may wrap)."""
    out = []
    for path in sorted((ROOT / "memest").rglob("*.py")):
        text = re.sub(r"\s+", " ", path.read_text())
        out += [(str(path.relative_to(ROOT)), section) for section in CITATION.findall(text)]
    return out


def test_every_cited_section_is_a_heading() -> None:
    headings = {line.lstrip("#").strip() for line in (ROOT / "DESIGN.md").read_text().splitlines()
                if line.startswith("#")}
    cited = citations()
    assert len(cited) >= 9  # the modules whose narratives live in DESIGN.md cite it
    assert [(path, s) for path, s in cited if s not in headings] == []
