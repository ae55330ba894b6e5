"""The provider's version: the one place it is written.

pyproject.toml reads it from here (`[tool.setuptools.dynamic]`), `ipam-provider --version` prints it, the start-up
log line carries it, and the Dockerfile's `VERSION` build argument defaults to it (a test keeps them in step).
"""

__version__ = "0.2.0"
