"""The decider's C extension; everything else about the package is in pyproject.toml.

decider/placement/_entry_index.c joins a placement answer's nodes (docs/benchmarks.md,
"Where the time goes"). Building it takes a C compiler and Python's headers, which `make`
installs where they are missing (scripts/debian-packages.sh).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "decider.placement._entry_index",
            sources=["decider/placement/_entry_index.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
        )
    ]
)
