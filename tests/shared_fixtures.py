"""Where the tests' real-world fixtures live: tests/fixtures, in the repository.

They are verbatim copies of files of the project's shared fixtures (`shared/fixtures` beside
the repository, where they came from; each folder's README.md says from where upstream and
under which licence), so that a clone alone runs the tests. LLMGW_SHARED_FIXTURES points the
tests at another copy laid out the same way, such as that shared folder itself.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED_FIXTURES = Path(
    os.environ.get("LLMGW_SHARED_FIXTURES") or Path(__file__).resolve().parent / "fixtures"
)
