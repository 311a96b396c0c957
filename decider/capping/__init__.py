"""GPU capping of oversubscribed domains (issue 20, docs/oversubscription.md).

- `ladder`: the capping ladder, pure (no I/O, no clock): the decider and the week simulator
  both drive it.
- `feeds`: a lost feed of a domain and what its surviving feeds carry.
- `driver`: the decider's side: `Capper` moves every oversubscribed domain's ladder at each
  refresh, keeps the states in memory and answers the node agents' leases.
- `collector`: the ladders on the decider's /metrics.
"""
