"""Pre-training scaling laws: the loss a model of ``N`` parameters reaches after ``D`` training tokens, the tokens a
loss target needs, the compute-optimal (Chinchilla) allocation and the cost of repeating data.

Dense laws have Hoffmann et al.'s form ``L(N, D) = E + A / N^alpha + B / D^beta``:

- ``chinchilla``: Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", approach 3 (their
  eq. 10): E 1.69, A 406.4, B 410.7, alpha 0.34, beta 0.28.
- ``epoch``: Besiroglu et al. 2024 (Epoch AI), "Chinchilla Scaling: A replication attempt", the re-fit of the same
  form to Hoffmann et al.'s data: E 1.8172, A 482.01, B 2085.43, alpha 0.3478, beta 0.3658.

Repeated data (Muennighoff et al. 2023, "Scaling Data-Constrained Language Models"): ``D`` tokens drawn from
``U`` unique ones (``R = D / U - 1`` repetitions) are worth ``D' = U + U R* (1 - exp(-R / R*))`` fresh tokens with
``R* = 15.4``, so a loss that needs ``D'`` effective tokens costs ``D = U (1 - R* ln(1 - (D'/U - 1) / R*))`` and no
amount of repetition gives more than ``U (1 + R*)``.

Sparse (MoE) models enter the same laws through an effective parameter count: a model of ``N_total`` parameters of
which ``N_active`` fire per token reaches the loss of a dense model of
``N_eff = N_active (N_total / N_active)^s`` parameters, ``s`` = :data:`SPARSE_EXPONENT` = 1/2 (the geometric mean of
total and active). That is the lecture the project starts from: "you need to increase total parameters a hundredfold
to get the equivalent of 10x as many active parameters" (Reiner Pope, seeds/001). Training costs ``6 N_active D``.
``s`` is an input (``--sparse-exponent``): 0 prices a MoE as its active parameters, 1 as its total; a fitted law's
exponent belongs there. The data term is the dense law's (a MoE at the same effective size needs the same tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import InfeasibleError, InputError


@dataclass(frozen=True)
class ScalingLaw:
    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str

    def loss(self, n: float, d: float) -> float:
        return self.E + self.A / n ** self.alpha + self.B / d ** self.beta

    def tokens_for(self, n: float, loss: float) -> float | None:
        """Effective training tokens a model of ``n`` parameters needs to reach ``loss`` (``None``: it cannot)."""
        left = loss - self.E - self.A / n ** self.alpha
        return (self.B / left) ** (1.0 / self.beta) if left > 0 else None

    def optimal_tokens(self, n: float) -> float:
        """The compute-optimal tokens for ``n`` parameters (the allocation that minimises the loss at compute
        ``6 N D``): ``N_opt = G (C/6)^a``, ``D_opt = (C/6)^b / G`` with ``G = (alpha A / (beta B))^(1/(alpha+beta))``,
        ``a = beta / (alpha + beta)``, ``b = alpha / (alpha + beta)``, so ``D_opt(N) = (N / G)^(b/a) / G``."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        a = self.beta / (self.alpha + self.beta)
        b = self.alpha / (self.alpha + self.beta)
        return (n / g) ** (b / a) / g

    def compute_optimal(self, loss: float) -> tuple[float, float]:
        """``(N, D)`` of least training compute ``6 N D`` that reaches ``loss`` (a golden-section search in
        ``log N``; the compute is unimodal along the loss contour)."""
        self.check(loss)
        lo = math.log((self.A / (loss - self.E)) ** (1.0 / self.alpha)) + 1e-9  # below it no D reaches the loss
        hi = lo + math.log(1e6)

        def flops(x: float) -> float:
            d = self.tokens_for(math.exp(x), loss)
            return math.inf if d is None else math.exp(x) * d

        x = golden(flops, lo, hi)
        return math.exp(x), self.tokens_for(math.exp(x), loss)

    def check(self, loss: float) -> None:
        if loss <= self.E:
            raise InputError(f"loss: {loss:g} is not above the {self.name} law's irreducible loss E = {self.E:g}; "
                             "no model reaches it")


LAWS: dict[str, ScalingLaw] = {
    "chinchilla": ScalingLaw("chinchilla", 1.69, 406.4, 410.7, 0.34, 0.28,
                             "Hoffmann et al. 2022, Training Compute-Optimal Large Language Models, approach 3 (eq. 10)"),
    "epoch": ScalingLaw("epoch", 1.8172, 482.01, 2085.43, 0.3478, 0.3658,
                        "Besiroglu et al. 2024 (Epoch AI), Chinchilla Scaling: A replication attempt"),
}
REPEAT_DECAY = 15.4
"""``R*_D`` of Muennighoff et al. 2023: repetitions after which repeated tokens are worth 1/e of fresh ones."""


SPARSE_EXPONENT = 0.5
"""``s`` of ``N_eff = N_active (N_total / N_active)^s``: a hundredfold total parameters is worth tenfold active ones."""


def effective_params(total: float, active: float, exponent: float = SPARSE_EXPONENT) -> float:
    """The dense-equivalent parameters of a model of ``total`` parameters, ``active`` of them per token."""
    return active * (total / active) ** exponent if active < total else total


def tokens_with_repeats(effective: float, unique: float | None) -> float:
    """Tokens to train on for ``effective`` fresh-token equivalents from ``unique`` unique tokens (``None``: no
    limit); :class:`InfeasibleError` where repetition cannot give that many."""
    if unique is None or effective <= unique:
        return effective
    r = (effective / unique - 1.0) / REPEAT_DECAY
    if r >= 1.0:
        raise InfeasibleError(f"the loss needs {effective:.3g} effective tokens; {unique:.3g} unique tokens repeated "
                              f"give at most {unique * (1 + REPEAT_DECAY):.3g} (Muennighoff et al. 2023)")
    return unique * (1.0 - REPEAT_DECAY * math.log(1.0 - r))


def golden(f, lo: float, hi: float, tol: float = 1e-7) -> float:
    """The minimiser of a unimodal ``f`` on ``[lo, hi]``."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol * max(1.0, abs(a)):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2.0
