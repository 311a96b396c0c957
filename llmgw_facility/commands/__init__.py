"""The commands that call a running decider, one module per group: `domains` (the facility
table, hold, release, override), `placement` (explain-placement, headroom) and
`recommendations` (profiles, the shedding plan, failover). Each takes a
`llmgw_facility.client.Decider`, prints, and returns the exit status."""
