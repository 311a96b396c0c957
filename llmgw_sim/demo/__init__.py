"""`llmgw-facility demo`: the whole system on a simulated site (DESIGN.md §7).

`main.py` starts it and tears it down, `stack.py` runs the real servers (Prometheus,
Alertmanager, the decider), `scale.py` divides the rules' durations by the time scale,
and `story.py` tells and checks the story. docs/simulation.md, "The demo".
"""
