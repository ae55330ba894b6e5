"""Typed shapes of the Kubernetes objects the controller reads and writes."""
