"""The chaos runner: allocations and releases under faults, then a check against the truth (see `runner`)."""
