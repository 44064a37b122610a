"""The planner's version (the distribution's, kept here so that every layer can read it)."""

__version__ = "0.1.0"
