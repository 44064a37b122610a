"""What a model tells the solver about itself, beyond its rows and columns: a typed interface in place of private
attributes the solver would look for.

A model declares it once (:func:`declare`); the solver reads it (:func:`structure_of`). A model that declares
nothing is solved as it stands."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ATTRIBUTE = "solver_structure"


@dataclass(frozen=True)
class Structure:
    blocks: Callable[[], list[tuple[list, list[float]]]] | None = None
    """Per block, its variables and a linear cost of them at the prices the model holds now
    (:mod:`planner.solve.floors` bounds each block's least cost); ``None``: no blocks."""
    covers: Callable[[], list] | None = None
    """Per block, its demand constraint and per stream its variable and stage constraints (:mod:`planner.solve.master`
    enumerates the blocks' slot vectors); ``None``: none declared."""
    objective_covers_blocks: bool = False
    """Whether every plan's objective is at least the sum of the blocks' costs (the floors then give ceilings too)."""
    refresh: Callable[[], None] | None = None
    """Brings bounds the model derives from its parameters up to date (called before every load and check)."""
    lazy: Callable[[], bool] | None = None
    """Lazy constraints: called on each solution the solver loads into the model, switches on the constraints it
    breaks and says whether it did (the solver then solves again). Constraints that rarely bind but weaken the
    search wait until a solution breaks them; a solution that breaks none is optimal with them too (it is optimal
    for a relaxation and feasible)."""
    restart: Callable[[], dict | None] | None = None
    """A plan that meets the constraints :attr:`lazy` switched on (a MIP start for the solve after it), or
    ``None``."""


def declare(model, structure: Structure) -> None:
    """Attach ``structure`` to ``model``."""
    setattr(model, ATTRIBUTE, structure)


def structure_of(model) -> Structure:
    """What ``model`` declared (an empty :class:`Structure` where it declared nothing)."""
    found = getattr(model, ATTRIBUTE, None)
    return found if isinstance(found, Structure) else Structure()
