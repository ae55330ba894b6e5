"""The backend contract (`contract`, `repair`) and the registry that finds backends by entry point (`registry`)."""
