"""The decider's status page (`/`, decider/templates/status.html.j2, docs/decider.md): rendered
by headless Chromium against the running demo, after its story (a rack filled and refused,
row 12 hot); the test holds a rack and asks for a placement there, then reads the DOM
Chromium built and saves a screenshot."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import requests

from decider.decisions import DecisionLog, group_reasons
from tests import demo_running

HELD_RACK = "r13-01"
HOLD_REASON = "status-page test: PDU maintenance"
CHROMIUM_TIMEOUT_S = 90


# --- the ring, without a browser ------------------------------------------------------------


def test_the_decision_ring_keeps_the_newest_and_groups_reasons():
    clock = iter(range(100)).__next__
    log = DecisionLog(capacity=3, clock=lambda: float(clock()))
    for i in range(5):
        log.record("placement", f"replica {i}", "0/2 nodes allowed", allowed=False)
    assert [r.subject for r in log.recent()] == ["replica 4", "replica 3", "replica 2"]
    grouped = group_reasons(
        [
            ("n1", "rack r1 hot"),
            ("n2", "rack r1 hot"),
            ("n3", "rack r2 held"),
            ("n4", "rack r1 hot"),
            ("n5", "rack r1 hot"),
        ],
        shown_nodes=3,
    )
    assert [(g.text, g.nodes, g.count) for g in grouped] == [
        ("rack r1 hot", ("n1", "n2", "n4"), 4),
        ("rack r2 held", ("n3",), 1),
    ]


# --- the page in Chromium --------------------------------------------------------------------


class _Elements(HTMLParser):
    """Every element with an id: its attributes and its text (descendants' included)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, str]] = {}
        self.text: dict[str, list[str]] = {}
        self._open: list[str | None] = []
        self.rows: list[tuple[str, str]] = []  # (class, text) of every <tr>
        self._rows: list[list[str]] = []
        self._row_class: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        ident = values.get("id")
        if ident:
            self.by_id[ident] = values
            self.text[ident] = []
        if tag in ("meta", "br", "img", "link", "input"):
            return
        self._open.append(ident)
        if tag == "tr":
            self._rows.append([])
            self._row_class.append(values.get("class", ""))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("meta", "br", "img", "link", "input"):
            return
        if self._open:
            self._open.pop()
        if tag == "tr" and self._rows:
            self.rows.append((self._row_class.pop(), " ".join("".join(self._rows.pop()).split())))

    def handle_data(self, data: str) -> None:
        for ident in self._open:
            if ident:
                self.text[ident].append(data)
        for row in self._rows:
            row.append(data)

    def text_of(self, ident: str) -> str:
        return " ".join("".join(self.text[ident]).split())


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail("chromium is missing: `make debian-packages` installs it")
    return subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=CHROMIUM_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="session")
def demo(request, tmp_path_factory):
    return demo_running.shared(request, tmp_path_factory)


def _domains(demo) -> dict[str, dict]:
    response = requests.get(f"{demo.decider}/v1/domains", timeout=10)
    response.raise_for_status()
    return {f"{d['kind']}/{d['domain']}": d for d in response.json()["domains"]}


@pytest.fixture(scope="module")
def page(demo, tmp_path_factory):
    """The demo after its story, a rack held and a placement refused there: the DOM Chromium
    built from `/`, parsed; the screenshot's path."""
    auth = {"Authorization": f"Bearer {demo.token}"}
    # a hot rack: the story ends with row 12 hot; its racks follow within the hold time
    deadline = time.monotonic() + 120
    while not any(
        d["condition"] == "hot" for ref, d in _domains(demo).items() if ref.startswith("rack/")
    ):
        assert time.monotonic() < deadline, f"no rack turned hot: {_domains(demo)}"
        time.sleep(0.5)
    held = requests.post(
        f"{demo.decider}/v1/domains/rack/{HELD_RACK}/hold",
        json={"reason": HOLD_REASON},
        headers=auth,
        timeout=10,
    )
    assert held.status_code == 200, held.text
    nodes = requests.get(f"{demo.decider}/v1/domains/rack/{HELD_RACK}", timeout=10).json()["nodes"]
    answer = requests.post(
        f"{demo.decider}/v1/placements",
        json={
            "replica": {"model": "llama-70b", "profile": "llama-70b-tp4", "gpus": 4},
            "candidates": nodes,
        },
        timeout=10,
    ).json()
    assert answer["order"] == [], answer
    refused = sorted({r for node in answer["nodes"] for r in node["reasons"]})
    try:
        directory = tmp_path_factory.mktemp("chromium")
        dom = _chromium(["--dump-dom", f"{demo.decider}/"], directory / "profile-dom")
        assert dom.returncode == 0, dom.stderr
        screenshot = directory / "status-page.png"
        shot = _chromium(
            ["--window-size=1400,2200", f"--screenshot={screenshot}", f"{demo.decider}/"],
            directory / "profile-shot",
        )
        assert shot.returncode == 0, shot.stderr
    finally:
        requests.post(
            f"{demo.decider}/v1/domains/rack/{HELD_RACK}/release", headers=auth, timeout=10
        )
    elements = _Elements()
    elements.feed(dom.stdout)
    return {
        "dom": dom.stdout,
        "elements": elements,
        "screenshot": screenshot,
        "refused": refused,
        "domains": _domains(demo),
    }


def test_every_rack_is_summarised_with_its_figures(page):
    elements = page["elements"]
    racks = {
        ref.split("/", 1)[1]: d for ref, d in page["domains"].items() if ref.startswith("rack/")
    }
    assert set(racks) >= {"r12-01", "r12-02", "r13-01", "r13-02"}
    for name, rack in racks.items():
        ident = f"rack-{name}"
        assert ident in elements.by_id, f"rack {name} missing from the page"
        text = elements.text_of(ident)
        assert name in text
        if rack["cap_watts"] is not None:
            assert f"{rack['cap_watts'] / 1000:.1f}" in text, text
    # headroom as a bar: a width in per cent of the cap
    assert 'class="bar"' in page["dom"] and 'style="width:' in page["dom"]


def _cells(dom: str, ident: str) -> dict[str, float | None]:
    """The kW cells of the row with this id that carry a class (room, cap-less-load), as
    numbers; None for "-"."""
    row = dom.split(f'id="{ident}"', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r'<td(?: class="([^"]*)")?>([^<]*)</td>', row)

    def number(text: str) -> float | None:
        return None if text.strip() == "-" else float(text)

    return {name: number(text) for name, text in cells if name in ("room", "cap-less-load")}


def test_headroom_is_what_placement_allows_and_cap_less_load_is_named(page):
    """HEADROOM is the limit less the load (the room placement allows); the cap less the load
    is its own column, named so. The two differ by the margin, cap − limit (/v1/domains),
    whatever the load was when the page was drawn (each figure rounded to 0.1 kW)."""
    dom = page["dom"]
    assert "<th>cap − load kW</th>" in dom
    budgeted = {
        ref.split("/", 1)[1]: d
        for ref, d in page["domains"].items()
        if ref.startswith("rack/") and d["cap_watts"]
    }
    assert budgeted
    for name, rack in budgeted.items():
        cells = _cells(dom, f"rack-{name}")
        assert cells["room"] is not None and cells["cap-less-load"] is not None, (name, cells)
        margin_kw = (rack["cap_watts"] - rack["limit_watts"]) / 1000
        assert margin_kw > 0, rack
        assert abs(cells["cap-less-load"] - cells["room"] - margin_kw) <= 0.11, (name, cells)


def test_a_hot_rack_is_shown_hot(page):
    elements = page["elements"]
    hot = [
        ref.split("/", 1)[1]
        for ref, d in page["domains"].items()
        if ref.startswith("rack/") and d["condition"] == "hot"
    ]
    assert hot, page["domains"]
    for name in hot:
        attrs = elements.by_id[f"rack-{name}"]
        assert "hot" in attrs["class"].split(), attrs
        assert attrs["data-condition"] == "hot"
        assert "hot" in elements.text_of(f"rack-{name}")
    cool = elements.by_id["rack-r13-02"]
    assert "hot" not in cool["class"].split()


def test_a_held_rack_is_marked(page):
    elements = page["elements"]
    attrs = elements.by_id[f"rack-{HELD_RACK}"]
    assert "is-held" in attrs["class"].split()
    text = elements.text_of(f"rack-{HELD_RACK}")
    assert "HELD" in text and HOLD_REASON in text
    for ident in elements.by_id:
        if ident.startswith("node-gpu-r13-01-"):
            assert f"rack/{HELD_RACK}" in elements.text_of(ident)


def test_refused_decisions_show_their_reasons(page):
    rows = page["elements"].rows
    refused = [text for cls, text in rows if "decision" in cls.split() and "refused" in cls.split()]
    assert refused, rows
    # the refusal on the held rack, just made, with the decider's own words
    assert page["refused"]
    for reason in page["refused"]:
        assert any(reason in text for text in refused), (reason, refused)
    # and the story's: the full rack's power figures
    assert any("rack r12-01:" in text and "kW" in text for text in refused), refused
    # accepted reservations are listed too
    assert any(
        "reservation" in text and "reserved" in text
        for cls, text in rows
        if "allowed" in cls.split()
    )


def test_the_nodes_are_listed(page):
    nodes = [ident for ident in page["elements"].by_id if ident.startswith("node-")]
    assert len(nodes) == 16


def test_a_screenshot_is_saved(page):
    screenshot: Path = page["screenshot"]
    print(f"status page screenshot: {screenshot}")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 10_000
