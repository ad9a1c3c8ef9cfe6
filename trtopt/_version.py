"""trtopt's version, at the bottom of the house: plans, caches and exports record it, and nothing here imports
the package root (which would run the public API's imports)."""

__version__ = "0.1.0"
