"""The backend contract (`contract`) and the registry that finds backends by entry point (`registry`).

The core owns both: backends import from here, the core never imports a backend.
"""
