"""Expert placement groundwork (issue 4): greedy EPLB baseline, balanced-router LP, placement MILP."""

from __future__ import annotations

import numpy as np
import pytest

from planner.errors import InputError
from planner.experts import balanced_imbalance, check_shape, place_experts
from planner.perf.experts import even_split_loads, greedy_pack, greedy_replicas, imbalance, zipf_loads


def test_greedy_replication_follows_eplb():
    load = np.array([8.0, 4.0, 2.0, 2.0])
    # copies go to the largest load per copy: 8 -> 8/2=4 -> tie 4 vs 4 (first) -> ...
    assert greedy_replicas(load, 1).tolist() == [2, 1, 1, 1]
    assert greedy_replicas(load, 3).tolist() == [3, 2, 1, 1]
    placement = greedy_pack(load, greedy_replicas(load, 4), 4)
    assert sorted(len(h) for h in placement) == [2, 2, 2, 2]
    assert all(len(set(h)) == len(h) for h in placement)


def test_imbalance_under_both_routings():
    load = np.array([3.0, 1.0, 1.0, 1.0])
    placement = [[0, 1], [0, 2], [3, 1]]  # expert 0 twice, expert 1 twice
    # even split: GPU loads 1.5+0.5, 1.5+1, 1+0.5 -> max 2.5 / mean 2
    assert imbalance(even_split_loads(load, placement)) == pytest.approx(2.5 / 2.0)
    # a balancing router can equalise: every GPU 2
    assert balanced_imbalance(load, placement, 3, 2) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_milp_never_worse_than_greedy(seed):
    load = zipf_loads(16, 1.5, seed)
    r = place_experts(load, 4, 0, time_limit_s=10)
    assert r.imbalance <= r.greedy_imbalance + 1e-9
    assert sorted(e for h in r.placement for e in h) == list(range(16))


def test_bad_shapes_are_input_errors():
    with pytest.raises(InputError, match="does not divide"):
        check_shape(256, 64, 32)
    assert check_shape(256, 32, 32) == 9
