"""`llmgw-facility`, the operator's CLI: the top of the import graph. It reads the
decider's files and API (`decider`), checks agent.yaml (`exporter`) and starts the
simulated site and the demo (`llmgw_sim`); nothing imports it.
"""
