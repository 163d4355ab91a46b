"""The repository stands alone: its code and docs cite only what a person who clones it can read.

No reference to design documents kept outside the repository, nor to the
numbers of the issues the work came from; docs/ says what a newcomer needs
in the project's own words.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Spelled in pieces, so that this file does not cite them itself.
OUTSIDE = re.compile("|".join((r"\.\./" + "shared", "SPEC" + r" §", "SPEC" + r"\.md", "DESIGN" + r"\.md",
                               r"\bnotes/" + r"[\w.-]+\.md", r"\(" + "notes" + r"\)", r"\b[Ii]ssues? " + r"\d+\b")))


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = [ROOT / n for n in names if not n.endswith((".json", ".jsonl")) and (ROOT / n).is_file()]
    return [f for f in files if b"\0" not in f.read_bytes()[:4096]]


def test_nothing_cites_a_document_outside_the_repository_or_an_issue_number():
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()[:120]}"
             for path in tracked_text_files()
             for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if OUTSIDE.search(line)]
    assert found == []


def test_every_doc_a_doc_links_to_is_there():
    links = re.compile(r"\bdocs/([\w.-]+\.md)\b")
    named = {m.group(1) for path in tracked_text_files() for m in links.finditer(path.read_text(errors="replace"))}
    assert sorted(n for n in named if not (ROOT / "docs" / n).is_file()) == []
