"""Shedding plans (DESIGN.md §5) and the loss of a feed: which replicas to move, to where.

The decider proposes; it never moves anything. One module per job:

- `moves`: which of a domain's replicas moves first, whether it may move at all, and where
  the placement rules would put it; shared by the plan and by failover.
- `planner`: the plan, a pure function of a View, the time and the pacing record (the last
  move proposed off each domain), so a test can drive it over generated sites; which
  domains are shed, how fast, and the power caps offered instead of moves.
- `shedder`: `Shedder` keeps the pacing record in the database and serves the plan on the
  current view (GET /v1/shedding, /metrics).
- `collector`: the plan's series on /metrics.
- `failover`: "what if this PDU fails" (GET /v1/failover).
"""
