"""The backend contract (`contract`, `repair`), the registry that finds backends by entry point (`registry`), and
the `ipam_provider_backend_*` series with which a backend counts its requests to an external system (`metrics`)."""
