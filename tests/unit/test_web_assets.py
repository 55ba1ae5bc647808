"""The web view's files, read as text: the page loads nothing from outside its folder, reads
only the scheduler's visibility endpoints (relative to itself, so it works under any proxy
prefix), puts data in the DOM only as text, and finds every element it looks up.

That its script runs, and what it shows, is checked in a real browser by
``tests/integration/test_web_view.py``."""

from __future__ import annotations

import re
from pathlib import Path

import batchsched

WEB = Path(batchsched.__file__).parent / "insight" / "web"
PAGE = (WEB / "index.html").read_text()
SCRIPT = (WEB / "app.js").read_text()
STYLE = (WEB / "style.css").read_text()

#: what the page may read: the contract's list endpoints, relative to /ui/
ENDPOINTS = {"../debug/queues", "../debug/jobs", "../debug/nodes"}


def test_the_page_links_only_its_own_files() -> None:
    links = set(re.findall(r'\b(?:src|href)="([^"]*)"', PAGE))
    assert links == {"style.css", "app.js"}
    assert {p.name for p in WEB.iterdir()} == {"index.html", "app.js", "style.css"}


def test_nothing_is_fetched_from_outside() -> None:
    for name, text in (("index.html", PAGE), ("app.js", SCRIPT), ("style.css", STYLE)):
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), name
        assert "@import" not in text and "url(" not in text, name


def test_the_script_reads_the_endpoints_of_the_contract_and_no_other() -> None:
    paths = set(re.findall(r'["`\']((?:\.\./|/)?debug/[^"`\'?]*)', SCRIPT))
    assert paths == ENDPOINTS
    assert SCRIPT.count("fetch(") == 1  # one place reads, with the paths above
    assert "../debug/snapshot" not in SCRIPT and "explain" not in SCRIPT


def test_data_reaches_the_dom_only_as_text() -> None:
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in SCRIPT, sink


def test_every_element_the_script_looks_up_is_in_the_page() -> None:
    ids = set(re.findall(r'\bid="([^"]+)"', PAGE))
    wanted = set(re.findall(r'getElementById\("([^"]+)"\)', SCRIPT))
    wanted |= set(re.findall(r'querySelector(?:All)?\("#([\w-]+)', SCRIPT))
    assert wanted and wanted <= ids, wanted - ids
