"""Step 2 of a claim's path: a deduplicating, rate-limited queue that serves pools in turn, live changes first."""
