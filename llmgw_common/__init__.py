"""What the exporter and the decider both use: YAML loading with file:line errors
and the catalogue of the metrics the exporter publishes (DESIGN.md §2).

Imports point one way: `exporter`, `decider` and `llmgw_sim` import this package;
it imports none of them.
"""
