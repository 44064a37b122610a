"""The analysis of a plan: which constraints bind and what relaxing each is worth, what N+k costs, and the
runner-up. Each is a re-solve of a relaxed model (:mod:`~planner.analysis.context`), asked as a
:class:`~planner.analysis.context.Question` (:mod:`~planner.analysis.questions`), answered here or in worker
processes (:mod:`~planner.analysis.workers`), and written up (:mod:`~planner.analysis.binding`)."""
