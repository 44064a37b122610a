"""Studies built on the performance model: price curves (:mod:`~planner.studies.pricing`: dollars per token
against interactivity) and the insights across hardware and models (:mod:`~planner.studies.insights`)."""
