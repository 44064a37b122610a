"""The planner's version (the distribution's, kept here so that every layer can read it)."""

__version__ = "0.1.0"

PLAN_SCHEMA_VERSION = "2.7"
"""Version of ``plan.json``'s contract (:mod:`planner.results.schema`); here so that the catalog layer can check a
deployed fleet's plan before reading it."""
