"""Step 3 of a claim's path: level-triggered reconcilers for claims and pools."""
