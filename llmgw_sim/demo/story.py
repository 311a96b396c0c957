"""The demo's story, told in the terminal and checked as it goes.

1. The site comes up: Prometheus has scraped every simulated node and evaluated the
   rules, the decider has read them; the rack summary is printed.
2. A rack fills up: the demo acts as the scheduler and places replicas of one profile
   on the nodes of one rack (POST /v1/placements, then /v1/reservations and confirm),
   each time waiting until the rack's measured power (the simulated nodes' load follows
   the reservations) reaches the decider, until the decider refuses the next one; the
   refusal is printed with its figures.
3. A cooling unit fails: the scenario's timeline starts; its row's inlet air rises, its
   racks turn warm and the row with them, then the cooling unit's alarm makes the row hot
   (the decider's condition, from the rules: a row from its own evidence, never from one
   rack); the room and the site stay as they were.
4. Placements move elsewhere: the same replica with every node as a candidate, the hot
   row's nodes first: they are refused as hot, and the replica lands in another row.
5. The alert arrives: LlmgwDomainHot for that row, read from Alertmanager's API.
6. The shedding plan: once the row's domains have been hot for the facility file's
   `shedding.hot_for`, GET /v1/shedding proposes moving a replica off the rack that was
   filled, to a node outside the hot row; the plan is printed, nothing is moved.

Each step has a deadline; a step that does not happen in time raises StoryFailed, saying
what was awaited and what was last seen. Nothing waits a fixed time to synchronise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import requests

from llmgw_sim.engine import Simulator
from llmgw_sim.scenario import CoolingFailure

POLL_S = 0.25


class StoryFailed(Exception):
    """A step of the story did not happen; `str()` says which and what was seen."""


@dataclass
class Cast:
    """Who the story talks to, and about what."""

    simulator: Simulator
    decider: str
    token: str
    prometheus: str
    alertmanager: str
    model: str
    profile: str
    gpus: int
    time_scale: float
    out: TextIO
    started: float = field(default_factory=time.monotonic)


def kw(watts: float | None) -> str:
    return "-" if watts is None else f"{watts / 1000:.1f} kW"


class Story:
    def __init__(self, cast: Cast, *, deadline_s: float = 120.0) -> None:
        self.cast = cast
        self.deadline_s = deadline_s
        self.sim = cast.simulator
        self.session = requests.Session()
        self.auth = {"Authorization": f"Bearer {cast.token}"}
        self.placed = 0
        cooling = [
            (event, event.body)
            for event in self.sim.scenario.events
            if isinstance(event.body, CoolingFailure)
        ]
        if not cooling:
            raise StoryFailed("the demo scenario has no cooling_failure event")
        self.cooling_event, self.cooling = cooling[0]
        self.row = self.cooling.row
        self.rack = self.sim.scenario.row_racks[self.row][0]
        self.row_nodes = [n.name for n in self.sim.nodes if n.place.row == self.row]
        self.rack_nodes = [n.name for n in self.sim.nodes if n.place.rack == self.rack]

    # --- telling ---------------------------------------------------------------------------

    def say(self, text: str = "") -> None:
        elapsed = time.monotonic() - self.cast.started
        for i, line in enumerate(text.splitlines() or [""]):
            stamp = f"[{elapsed:6.1f}s]" if i == 0 and line else " " * 9
            print(f"{stamp} {line}", file=self.cast.out, flush=True)

    def title(self, text: str) -> None:
        print(file=self.cast.out)
        self.say(f"== {text}")

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float | None = None) -> Any:
        """`check()`'s first truthy value, polled until the deadline; StoryFailed after."""
        deadline = time.monotonic() + (timeout_s or self.deadline_s)
        last: Any = None
        while True:
            try:
                last = check()
            except requests.RequestException as exc:
                last = exc
            else:
                if last:
                    return last
            if time.monotonic() > deadline:
                raise StoryFailed(f"timed out waiting for {what}; last seen: {last!r}")
            time.sleep(POLL_S)

    # --- the decider and Prometheus ------------------------------------------------------------

    def get(self, path: str) -> Any:
        response = self.session.get(f"{self.cast.decider}{path}", timeout=5)
        response.raise_for_status()
        return response.json()

    def domain(self, kind: str, name: str) -> dict[str, Any]:
        return dict(self.get(f"/v1/domains/{kind}/{name}"))

    def query(self, promql: str) -> list[dict[str, Any]]:
        response = self.session.get(
            f"{self.cast.prometheus}/api/v1/query", params={"query": promql}, timeout=5
        )
        response.raise_for_status()
        return list(response.json()["data"]["result"])

    def replica(self) -> dict[str, Any]:
        return {"model": self.cast.model, "profile": self.cast.profile, "gpus": self.cast.gpus}

    def free_gpus(self) -> dict[str, int]:
        reserved: dict[str, int] = {}
        for reservation in self.get("/v1/reservations")["reservations"]:
            reserved[reservation["node"]] = reserved.get(reservation["node"], 0) + int(
                reservation["gpus"]
            )
        return {node.name: len(node.gpus) - reserved.get(node.name, 0) for node in self.sim.nodes}

    def candidates(self, nodes: list[str]) -> list[str]:
        free = self.free_gpus()
        return [node for node in nodes if free[node] >= self.cast.gpus]

    def place(self, candidates: list[str]) -> dict[str, Any]:
        response = self.session.post(
            f"{self.cast.decider}/v1/placements",
            json={"replica": self.replica(), "candidates": candidates},
            timeout=5,
        )
        response.raise_for_status()
        return dict(response.json())

    def reserve(self, node: str) -> dict[str, Any]:
        self.placed += 1
        ident = f"{self.cast.model}-{self.placed}"
        response = self.session.post(
            f"{self.cast.decider}/v1/reservations",
            json={"id": ident, "replica": self.replica(), "node": node},
            headers=self.auth,
            timeout=5,
        )
        if response.status_code != 201:
            raise StoryFailed(
                f"reserving {ident} on {node}: HTTP {response.status_code} {response.text}"
            )
        confirmed = self.session.post(
            f"{self.cast.decider}/v1/reservations/{ident}/confirm", headers=self.auth, timeout=5
        )
        confirmed.raise_for_status()
        return dict(confirmed.json())

    # --- the story ---------------------------------------------------------------------------

    def run(self) -> None:
        self.site_up()
        self.fill_rack()
        self.cooling_failure()
        self.place_elsewhere()
        self.alert_arrives()
        self.shedding_plan()

    def site_up(self) -> None:
        self.title("1. The site comes up")
        self.say("waiting for Prometheus to scrape every node and the decider to read the rules")
        names = {node.place.rack for node in self.sim.nodes}

        def ready() -> Any:
            domains = [d for d in self.get("/v1/domains")["domains"] if d["kind"] == "rack"]
            known = {d["domain"] for d in domains if d["measured_watts"] is not None}
            conditions = {d["condition"] for d in domains if d["domain"] in names}
            return domains if known >= names and conditions == {"ok"} else None

        seen = self.wait("every rack measured and ok", ready)
        rack_nodes = set(self.rack_nodes)
        self.wait(
            f"the decider to know rack {self.rack}'s nodes",
            lambda: set(self.domain("rack", self.rack)["nodes"]) == rack_nodes,
        )
        racks = [d for d in seen if d["domain"] in names]
        self.say(f"{len(self.sim.nodes)} nodes read; the racks as the decider sees them:")
        self.say(f"{'RACK':10} {'CONDITION':9} {'CAP':>9} {'MEASURED':>9} {'HEADROOM':>9}")
        for rack in racks:
            self.say(
                f"{rack['domain']:10} {rack['condition']:9} {kw(rack['cap_watts']):>9} "
                f"{kw(rack['measured_watts']):>9} {kw(rack['headroom_watts']):>9}"
            )

    def fill_rack(self) -> None:
        self.title(
            f"2. Replicas of {self.cast.profile} placed on rack {self.rack} until it is full"
        )
        limit = len(self.rack_nodes) * max(len(self.sim.nodes[0].gpus), 1) + 1
        for _ in range(limit):
            candidates = self.candidates(self.rack_nodes)
            if not candidates:
                raise StoryFailed(f"rack {self.rack} ran out of GPUs before the decider refused")
            answer = self.place(candidates)
            if not answer["order"]:
                self.refused(answer)
                return
            node = answer["order"][0]
            reservation = self.reserve(node)
            rack = self.domain("rack", self.rack)
            self.say(
                f"replica {reservation['id']} -> {node}: estimate "
                f"{kw(reservation['estimate_watts'])}, rack {self.rack} has "
                f"{kw(rack['reserved_watts'])} reserved"
            )
            self.power_follows(node)
        raise StoryFailed(f"rack {self.rack} never refused a replica")

    def power_follows(self, node: str) -> None:
        """Wait until the decider measures what the rack now draws (the simulated nodes'
        load follows the reservations)."""
        busy = len(self.sim.node(node).gpus) - self.free_gpus()[node]
        sim_node = self.sim.node(node)

        def applied() -> bool:
            loaded = sum(1 for gpu in sim_node.gpus if gpu.load >= self.sim.replica_load)
            return self.sim.reserved_gpus.get(node, 0) == busy and loaded == busy

        self.wait(f"the simulator to load {node}'s {busy} reserved GPUs", applied)
        draws = self.sim.rack_watts(self.rack)

        def measured() -> Any:
            rack = self.domain("rack", self.rack)
            value = rack["measured_watts"]
            return rack if value is not None and value >= 0.98 * draws else None

        rack = self.wait(f"rack {self.rack}'s measured power to reach {kw(draws)}", measured)
        self.say(
            f"  the rack now draws {kw(rack['measured_watts'])} (measured), load "
            f"{kw(rack['load_watts'])} of a {kw(rack['cap_watts'])} cap"
        )

    def refused(self, answer: dict[str, Any]) -> None:
        reasons = [reason for node in answer["nodes"] for reason in node["reasons"]]
        power = [reason for reason in reasons if reason.startswith(f"rack {self.rack}:")]
        if not power:
            raise StoryFailed(
                f"the decider refused, but not for rack {self.rack}'s power: {answer}"
            )
        if self.placed == 0:
            raise StoryFailed(f"the decider refused the first replica already: {power[0]}")
        self.say(f"the next replica is refused: {answer['summary']}")
        self.say(f"  {power[0]}")

    def cooling_failure(self) -> None:
        cooling = self.cooling
        self.title(f"3. A cooling unit of row {self.row} fails")
        alarm = (
            f", its alarm going off after {_minutes(cooling.alarm_after)}"
            if cooling.alarm_after is not None
            else ""
        )
        self.say(
            f"scenario: the inlet air of row {self.row} rises {cooling.rise_c:g} °C over "
            f"{_minutes(cooling.over)}{alarm} (time runs {self.cast.time_scale:g}x faster here)"
        )
        self.sim.start_timeline(time.time() - self.cooling_event.at / self.cast.time_scale)
        seen: list[str] = []
        last_inlet: list[float] = []

        def progress() -> bool:
            row = self.domain("row", self.row)
            result = self.query(
                f'max(llmgw_domain_inlet_temperature_celsius{{kind="row",domain="{self.row}"}})'
            )
            inlet = float(result[0]["value"][1]) if result else None
            condition = row["condition"]
            moved = inlet is not None and (not last_inlet or abs(inlet - last_inlet[-1]) >= 1)
            if not seen or condition != seen[-1] or moved:
                clock = self.sim.timeline_time(time.time()) or 0.0
                alarm_on = self.row in self.sim.effects.alarms
                self.say(
                    f"t+{_minutes(clock):>7}  row {self.row}: inlet "
                    f"{'-' if inlet is None else f'{inlet:.1f} °C'}, {condition}"
                    f"{', cooling unit in alarm' if alarm_on else ''}"
                )
                if inlet is not None:
                    last_inlet.append(inlet)
            if not seen or condition != seen[-1]:
                seen.append(condition)
            return condition == "hot"

        self.wait(f"row {self.row} to turn hot", progress, timeout_s=self.deadline_s * 2)
        if "warm" not in seen:
            raise StoryFailed(f"row {self.row} went {' -> '.join(seen)}: never warm before hot")
        self.say(f"row {self.row} went {' -> '.join(seen)}")
        # Each kind from its own evidence: the row's heat is not its room's or site's.
        place = self.sim.node(self.row_nodes[0]).place
        parents = [("room", place.room), ("site", place.site)]
        conditions = {kind: self.domain(kind, name)["condition"] for kind, name in parents}
        if "hot" in conditions.values():
            raise StoryFailed(f"row {self.row}'s heat made its parents hot: {conditions}")
        self.say(
            ", ".join(f"{kind} {name} {conditions[kind]}" for kind, name in parents)
            + f": row {self.row}'s heat is not theirs"
        )

    def place_elsewhere(self) -> None:
        self.title("4. Placements move elsewhere")
        order = self.row_nodes + [n.name for n in self.sim.nodes if n.name not in self.row_nodes]
        candidates = self.candidates(order)
        answer = self.place(candidates)
        refused = {n["node"]: n["reasons"] for n in answer["nodes"] if not n["allowed"]}
        hot = [
            node
            for node in candidates
            if node in self.row_nodes and any("hot" in r for r in refused.get(node, []))
        ]
        in_row = [node for node in candidates if node in self.row_nodes]
        if sorted(hot) != sorted(in_row):
            raise StoryFailed(f"not every node of row {self.row} was refused as hot: {answer}")
        if not answer["order"] or answer["order"][0] in self.row_nodes:
            raise StoryFailed(f"the replica did not go outside row {self.row}: {answer}")
        reasons = [r for r in refused[hot[0]] if "hot" in r]
        example = next((r for r in reasons if r.startswith(f"row {self.row} hot")), reasons[0])
        self.say(f"{len(candidates)} candidates, row {self.row}'s first: {answer['summary']}")
        self.say(f"  {hot[0]} and the rest of row {self.row}: {example}")
        others = sorted(
            {r for node, reasons in refused.items() if node not in hot for r in reasons}
        )
        for reason in others:
            self.say(f"  elsewhere: {reason}")
        node = answer["order"][0]
        reservation = self.reserve(node)
        where = self.sim.node(node).place
        self.say(
            f"replica {reservation['id']} -> {node} (rack {where.rack}, row {where.row}); "
            f"the decider's order: {', '.join(answer['order'][:4])}"
            f"{' …' if len(answer['order']) > 4 else ''}"
        )

    def alert_arrives(self) -> None:
        self.title("5. The alert arrives at Alertmanager")

        def firing() -> Any:
            response = self.session.get(
                f"{self.cast.alertmanager}/api/v2/alerts",
                params={"filter": 'alertname="LlmgwDomainHot"', "active": "true"},
                timeout=5,
            )
            response.raise_for_status()
            for alert in response.json():
                labels = alert["labels"]
                if labels.get("kind") == "row" and labels.get("domain") == self.row:
                    return alert
            return None

        alert = self.wait(f"LlmgwDomainHot for row {self.row} at Alertmanager", firing)
        labels = alert["labels"]
        self.say(
            f"{labels['alertname']} ({labels.get('severity')}): {alert['annotations']['summary']}"
        )
        self.say("  " + " ".join(alert["annotations"]["description"].split()))

    def shedding_plan(self) -> None:
        self.title("6. The shedding plan")

        def proposed() -> Any:
            plan = self.get("/v1/shedding")
            for entry in plan["plan"]:
                if entry["domain"] == f"rack/{self.rack}" and entry["moves"]:
                    return plan
            return None

        plan = self.wait(f"a shedding plan that moves a replica off rack {self.rack}", proposed)
        self.say(plan["summary"])
        for entry in plan["plan"]:
            for move in entry["moves"]:
                where = self.sim.node(move["to"]).place
                if where.row == self.row:
                    raise StoryFailed(f"the plan moves {move['reservation']} into row {self.row}")
                hot = entry["hot_seconds"]
                self.say(
                    f"{entry['domain']}, hot for {hot:.0f}s ({_minutes(hot * self.cast.time_scale)}"
                    f" of the site's time): move "
                    f"{move['reservation']} ({move['model']}, class {move['class']}, "
                    f"{kw(move['estimate_watts'])}) {move['from']} -> {move['to']} "
                    f"(rack {where.rack}, row {where.row})"
                )
                self.say(f"  {move['reason']}")
        waiting = [e for e in plan["plan"] if not e["moves"]]
        for entry in waiting[:3]:
            self.say(f"{entry['domain']}: {entry['reason']}")
        if len(waiting) > 3:
            self.say(f"… and {len(waiting) - 3} more hot domains without a move of their own")
        self.say("the decider proposes; the scheduler's preemption would carry it out")


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s"
