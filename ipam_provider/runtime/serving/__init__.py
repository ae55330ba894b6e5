"""Serving the metrics: the `/metrics` endpoint, its authentication and authorisation, and its certificate."""
