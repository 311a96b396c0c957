"""The llmgw node exporter: a node's GPU, CPU and inlet sensors as `llmgw_*` metrics."""
