"""The decider's C extension; everything else about the package is in pyproject.toml.

decider/placement/_entry_index.c joins a placement answer's nodes (docs/benchmarks.md,
"Where the time goes"). Building it takes a C compiler and Python's headers, which `make`
installs where they are missing (scripts/debian-packages.sh). Optional: without them the
package installs all the same (an exporter's image needs no compiler) and the decider
joins in Python, placements taking up to twice as long (decider.placement.entry_index),
and says so at start.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "decider.placement._entry_index",
            sources=["decider/placement/_entry_index.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
