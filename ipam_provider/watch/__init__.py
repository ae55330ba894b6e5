"""Step 1 of a claim's path: watches keep local caches current and report changes to the queue."""
