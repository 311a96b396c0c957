"""`llmgw-facility capping`: each oversubscribed domain's capping ladder (GET /v1/capping), or
with `--node` the lease a node agent would get now (GET /v1/capping/leases/{node}, needs the
token)."""

from __future__ import annotations

import time
from urllib.parse import quote

from llmgw_facility.client import Decider
from llmgw_facility.output import kw, show_json, table


def _caps(caps: dict[str, float]) -> str:
    return ", ".join(f"{klass or '(no class)'} {cap:g} W" for klass, cap in caps.items()) or "-"


def capping_table(decider: Decider, node: str | None, as_json: bool) -> int:
    if node is not None:
        lease = decider.call("GET", f"/v1/capping/leases/{quote(node, safe='')}", mutating=True)
        if as_json:
            show_json(lease)
            return 0
        limit = lease["gpu_limit_watts"]
        print(
            f"node {lease['node']}: "
            f"{'no cap' if limit is None else f'{limit:g} W per GPU'} for "
            f"{lease['lease_seconds']:g} s, then the safe limit "
            f"{lease['safe_gpu_limit_watts']:g} W ({', '.join(lease['domains'])})"
        )
        print(f"  {lease['reason']}")
        return 0
    answer = decider.call("GET", "/v1/capping")
    if as_json:
        show_json(answer)
        return 0
    print(answer["summary"])
    now = time.time()
    rows = [
        [
            f"{entry['kind']}/{entry['domain']}",
            str(entry["step"]),
            kw(entry["power_watts"]),
            kw(entry["budget_watts"]),
            kw(entry["worst_case_watts"]),
            _caps(entry["caps"]),
            f"{entry['safe_gpu_limit_watts']:g}",
            f"{(now - entry['since']) / 60:.1f}m",
        ]
        for entry in answer["domains"]
    ]
    if rows:
        headers = ("DOMAIN", "STEP", "POWER KW", "BUDGET KW", "WORST KW", "CAPS", "SAFE W", "FOR")
        for line in table(headers, rows, frozenset({1, 2, 3, 4, 6, 7})):
            print(line)
    for entry in answer["domains"]:
        print(entry["reason"])  # it names the domain
    return 0
