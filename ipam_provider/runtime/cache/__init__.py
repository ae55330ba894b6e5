"""Informers: a list-then-watch per resource into a `Store` of projected objects."""
