"""The decision sidecar (DESIGN.md §5) and the operator CLI. Being built: see the issues."""
