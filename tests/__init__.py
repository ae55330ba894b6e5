"""The test suite.

pytest imports this package before tests/conftest.py, so this is the first of the suite's code to run: it lets
Python write bytecode caches (`__pycache__/`, ignored by git, .dockerignore and the suite's walks of the tree) even
when PYTHONDONTWRITEBYTECODE is set. Every xdist worker, and every `ipam-provider` or `python -m` subprocess a test
starts, imports the same modules; without the caches each one compiles them from source again (about 1.5 s for a
subprocess that imports the controller, 10 s for a worker's collection). A subprocess inherits the variable, so it
writes nothing itself, but it reads the caches written here.
"""

import sys

sys.dont_write_bytecode = False
