"""Where the project's shared, real-world fixtures live: `../shared/fixtures` beside the repo.

CI lays a copy of shared/ beside its clone; set LLMGW_SHARED_FIXTURES to use
another copy.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED_FIXTURES = Path(
    os.environ.get("LLMGW_SHARED_FIXTURES")
    or Path(__file__).resolve().parents[2] / "shared" / "fixtures"
)
