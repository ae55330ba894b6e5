"""Step 2 of a claim's path: a deduplicating, rate-limited queue that serialises work per pool."""
