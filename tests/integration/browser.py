"""A real headless Chromium for tests of the web view: find it (installing Debian's
``chromium`` package when we are root, as CI is), load a page, return its DOM after the
page's scripts ran, or a screenshot of it.

The DOM is read with ``--dump-dom`` under a ``--virtual-time-budget``: Chromium runs the
page's timers and fetches until that much page time has passed, so what is dumped is what a
user sees once the first refresh has landed. :func:`parse` turns the dump into a small tree
to query (the standard library's parser; no browser driver is needed).

Without Chromium a test using :func:`chromium` is skipped on a developer's machine and fails
when ``CI=true`` (:func:`tests.debian.debian_tool`).
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from tests.debian import debian_tool

CHROMIUM = "/usr/bin/chromium"
PACKAGE = "chromium"  # Debian's
#: the flags this needs everywhere: no sandbox (root in a container), no GPU, no network
#: of its own (updates, sync, QUIC), no first-run UI
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
]


def chromium() -> str:
    """The Chromium binary; installed with apt-get when missing and we are root."""
    return debian_tool(CHROMIUM, PACKAGE, "chromium-browser")


def _run(url: str, *args: str, timeout: float) -> str:
    """Chromium on ``url`` with a fresh profile; its stdout. An exception the page's
    scripts did not catch (a syntax error included) fails the caller: the console is
    logged to stderr and read for them."""
    binary = chromium()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        done = subprocess.run(
            [binary, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
             *args, url],
            capture_output=True, text=True, timeout=timeout,
        )
    if done.returncode != 0:
        raise AssertionError(f"chromium exited {done.returncode} on {url}:\n{done.stderr[-3000:]}")
    uncaught = [line for line in done.stderr.splitlines() if ":CONSOLE" in line and "Uncaught" in line]
    if uncaught:
        raise AssertionError(f"the page's scripts failed on {url}:\n" + "\n".join(uncaught))
    return done.stdout


def dump_dom(url: str, *, wait_ms: int = 3000, timeout: float = 120, trust_ca: str | None = None) -> str:
    """The page's DOM, serialised, after ``wait_ms`` of page time (its fetches included);
    empty when the page did not load. ``trust_ca``: a CA (PEM) whose key Chromium accepts in
    the chain an HTTPS server presents (:func:`spki_pin`); without it Chromium trusts only
    its own roots."""
    pin = [f"--ignore-certificate-errors-spki-list={spki_pin(trust_ca)}"] if trust_ca else []
    return _run(url, "--dump-dom", f"--virtual-time-budget={wait_ms}", *pin, timeout=timeout)


def spki_pin(pem: str) -> str:
    """The base64 SHA-256 of a certificate's public key (SubjectPublicKeyInfo), as
    Chromium's ``--ignore-certificate-errors-spki-list`` takes it: a chain holding that key
    is accepted, any other is refused as usual."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(pem.encode()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def screenshot(url: str, path: Path, *, size: tuple[int, int] = (1280, 900), wait_ms: int = 3000,
               timeout: float = 120) -> Path:
    """A PNG of the page at ``size`` (width, height) after ``wait_ms`` of page time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _run(url, f"--screenshot={path}", f"--window-size={size[0]},{size[1]}",
         f"--virtual-time-budget={wait_ms}", timeout=timeout)
    if not path.exists():
        raise AssertionError(f"chromium wrote no screenshot of {url} to {path}")
    return path


# -- the dumped DOM as a tree ---------------------------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        """The text inside, as a user reads it (runs of white space as one space)."""
        return " ".join("".join(self._texts()).split())

    def _texts(self) -> Iterator[str]:
        for c in self.children:
            if isinstance(c, str):
                yield c
            else:
                yield from c._texts()

    def iter(self) -> Iterator[Element]:
        yield self
        for c in self.children:
            if isinstance(c, Element):
                yield from c.iter()

    def find_all(self, tag: str | None = None, *, cls: str | None = None, id: str | None = None) -> list[Element]:
        return [
            e for e in self.iter()
            if (tag is None or e.tag == tag) and (cls is None or cls in e.classes)
            and (id is None or e.attrs.get("id") == id)
        ]

    def find(self, tag: str | None = None, *, cls: str | None = None, id: str | None = None) -> Element:
        found = self.find_all(tag, cls=cls, id=id)
        if not found:
            raise AssertionError(f"no <{tag or '*'}> with class={cls!r} id={id!r} in the page")
        return found[0]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(html: str) -> Element:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root
