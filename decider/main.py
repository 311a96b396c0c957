"""`llmgw-decider`: the placement sidecar of DESIGN.md §5, not built yet."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print(
        "llmgw-decider: the decider is not built yet; this release ships the node exporter "
        "(llmgw-exporter).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
