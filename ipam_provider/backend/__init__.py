"""The backend contract (`protocol`, `contract`, `repair`), its registry, and the helpers every backend may use."""
