"""A simulated facility: many nodes' exporter metrics from one process (DESIGN.md §7).

A scenario file (`scenario.py`) lays out a site — rooms, rows, racks, dual-fed PDUs,
nodes and their GPUs — with each node's load, PDU traces to replay and a timeline of
events (a cooling unit failing, a GPU throttling, a BMC going silent, a PDU reading
lost). `engine.py` runs simple physics over it; `exposition.py` renders, once per tick,
what each node's `llmgw-exporter` would publish (same names, types and labels as
`llmgw_common/metrics.py`) and what the site's own meters would; `server.py` serves each
node as its own scrape target and writes a Prometheus file_sd target file.
`llmgw-facility simulate --scenario FILE` runs it; docs/simulation.md is the reference.
"""

from __future__ import annotations

from llmgw_sim.engine import Simulator
from llmgw_sim.scenario import Scenario, load

__all__ = ["Scenario", "Simulator", "load"]
