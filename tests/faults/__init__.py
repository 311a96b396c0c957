"""The fault-injection suite (issue 16): each fault a real process meets on a bad day,
done to the real exporter and decider, with what must happen instead. Marked `faults`
(`pytest -m faults` runs these alone); part of `make test`."""
