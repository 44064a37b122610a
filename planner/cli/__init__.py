"""The ``planner`` command line: a thin layer over the library (no logic the library lacks), one module per group
of commands (:mod:`~planner.cli.plan`, :mod:`~planner.cli.study`, :mod:`~planner.cli.catalog`,
:mod:`~planner.cli.calibrate`) on the application of :mod:`~planner.cli.app`."""

from planner.cli import calibrate, catalog, lifetime, plan, study  # noqa: F401  (registers the commands)
from planner.cli.app import app, main

__all__ = ["app", "main"]
