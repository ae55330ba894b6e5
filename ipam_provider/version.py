"""The provider's version, written here only: pyproject.toml, `--version`, the start-up log and the Dockerfile read."""

__version__ = "0.2.0"
