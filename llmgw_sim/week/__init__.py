"""A week of real traffic on a simulated site, fast (issue 20): no Prometheus, no HTTP.

`python -m llmgw_sim.week --out docs/img` runs today's admission and oversubscription with
the capping ladder on the same site and the same traffic, prints the targets table and
writes the plots. data.py reads the traces (tests/fixtures/traces/week), site.py builds the
site and its facility file, engine.py runs a policy, report.py makes the table and the
plots; docs/oversubscription-week.md explains the model.
"""
