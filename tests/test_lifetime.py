"""Lifetime economics (issue 48): the model family generator against the published members."""

from __future__ import annotations

import pytest

from planner.catalog import load_catalog
from planner.errors import InputError
from planner.perf.params import model_stats
from planner.studies.family import FAMILY_MEMBERS, generate, kv_bytes_per_token, members


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.mark.parametrize("family", sorted(FAMILY_MEMBERS))
def test_generator_reproduces_the_published_members(catalog, family):
    for m in members(catalog, family):
        pub = m.published.total_params_b * 1e9 if m.published and m.published.total_params_b else model_stats(m).total_params
        g = generate(catalog, family, pub)
        s, gs = model_stats(m), model_stats(g)
        assert gs.total_params == pytest.approx(s.total_params, rel=0.05), m.id
        assert gs.active_params == pytest.approx(s.active_params, rel=0.05), m.id
        assert kv_bytes_per_token(g) == pytest.approx(kv_bytes_per_token(m), rel=0.05), m.id


@pytest.mark.parametrize("family", sorted(FAMILY_MEMBERS))
def test_generated_sizes_hit_their_target_and_grow_monotonically(catalog, family):
    last = None
    for n in (2e9, 2e10, 1.5e11, 8e11):
        g = generate(catalog, family, n)
        s = model_stats(g)
        assert s.total_params == pytest.approx(n, rel=0.05)
        a = g.architecture
        assert a.attention.heads % a.attention.kv_heads == 0
        if last is not None:
            assert a.hidden_size >= last.hidden_size and a.layers >= last.layers
        last = a


def test_moe_active_share_sets_top_k(catalog):
    g = generate(catalog, "qwen3-moe", 1e11, active_share=0.2)
    s = model_stats(g)
    assert s.active_params / s.total_params == pytest.approx(0.2, abs=0.02)
    with pytest.raises(InputError):
        generate(catalog, "qwen3-moe", 1e11, active_share=1.5)
    with pytest.raises(InputError):
        generate(catalog, "nosuch", 1e11)


# ---------------------------------------------------------------------------------------------
# planner lifetime: the optimum over sizes, against the scaling law and the planner's own plans

import json  # noqa: E402
import math  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

from planner.studies.scaling import LAWS, tokens_with_repeats  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"


def test_scaling_laws_give_back_their_published_points():
    chin = LAWS["chinchilla"]
    # Hoffmann et al.'s approach-3 fit: Chinchilla (70B, 1.4T) at about 1.94
    assert chin.loss(70e9, 1.4e12) == pytest.approx(1.937, abs=0.002)
    epoch = LAWS["epoch"]
    n, d = epoch.compute_optimal(epoch.loss(70e9, 1.4e12))
    assert 15 < d / n < 25  # the Epoch re-fit's ~20 tokens per parameter
    assert epoch.optimal_tokens(n) == pytest.approx(d, rel=1e-4)  # the closed form agrees with the search
    # repeating 4 epochs of unique data is worth nearly fresh tokens; beyond U (1 + R*) nothing reaches the loss
    assert tokens_with_repeats(4e12, 1e12) == pytest.approx(4e12, rel=0.12)
    from planner.errors import InfeasibleError

    with pytest.raises(InfeasibleError):
        tokens_with_repeats(20e12, 1e12)


def _sweep(catalog, family: str, grid: int):
    """A lifetime sweep of ``family`` at Llama 3.1 8B's loss over four volumes, on a ``grid``-size grid."""
    import planner
    from planner.pipeline import lifetime as lt

    rs = planner.load_scenario(SCENARIO, catalog)
    loss = LAWS["epoch"].loss(8e9, 15e12)
    inputs = lt.LifetimeInputs(family, "epoch", loss, [0.0, 1e9, 1e11, 1e13], 365.0, "h100-sxm", 0.4)
    old = lt.GRID_POINTS
    lt.GRID_POINTS = grid
    try:
        points, choices = lt.lifetime(inputs, rs, catalog)
    finally:
        lt.GRID_POINTS = old
    return rs, inputs, points, choices


@pytest.fixture(scope="module")
def sweep(catalog):
    return _sweep(catalog, "llama3", 7)


def test_sparse_law_is_the_dense_law_at_the_effective_size():
    from planner.studies.scaling import effective_params

    # the seed's rule: a hundredfold total parameters is worth tenfold active ones
    assert effective_params(100e9, 1e9) == pytest.approx(10e9)
    assert effective_params(5e9, 5e9) == 5e9  # dense
    assert effective_params(100e9, 1e9, exponent=0.0) == pytest.approx(1e9)
    assert effective_params(100e9, 1e9, exponent=1.0) == pytest.approx(100e9)


@pytest.fixture(scope="module")
def moe_sweep(catalog):
    return _sweep(catalog, "qwen3-moe", 6)[1:]


def test_moe_zero_volume_is_the_compute_optimal_effective_size(moe_sweep):
    """With no serving, the MoE's effective size is the law's compute-optimal one; it trains at its active
    parameters, so it is a total several times larger, cheaper to train than the dense optimum."""
    inputs, points, choices = moe_sweep
    n_opt, d_opt = LAWS["epoch"].compute_optimal(inputs.loss)
    zero = choices[0].point
    assert zero.effective == pytest.approx(n_opt, rel=0.02)
    assert zero.tokens == pytest.approx(d_opt, rel=0.06)
    assert zero.active < 0.2 * zero.params and zero.params > 2 * n_opt
    from planner.pipeline.lifetime import train_usd

    assert zero.train_usd == pytest.approx(train_usd(inputs, load_catalog(), zero.active, zero.tokens))
    ok = [c for c in choices if c.point]
    assert ok[-1].point.effective < ok[0].point.effective  # heavy traffic shrinks it too
    assert all(p.tokens / p.optimal_tokens >= 0.98 for p in points if math.isfinite(p.tokens))


def test_moe_serving_cost_is_planner_plans_cost(moe_sweep, catalog):
    from planner.catalog.scenario import resolve_scenario
    from planner.options import PlanOptions
    from planner.pipeline.lifetime import family_model, scaled
    from planner.pipeline.plan import make_plan

    inputs, _, choices = moe_sweep
    c = choices[2]
    model = family_model(inputs, catalog, c.point.target_params)
    assert model.architecture.moe is not None and model.id == c.point.model_id
    cat = replace(catalog, models={**catalog.models, model.id: model})
    import planner

    base = planner.load_scenario(SCENARIO, catalog)
    sc = scaled(base.scenario.model_copy(update={"model": model.id}), c.volume)
    plan = make_plan(resolve_scenario(sc, cat, SCENARIO), PlanOptions(analysis=False)).plan
    assert c.serve_usd == pytest.approx(plan.objective.usd_per_hour * inputs.life_days * 24, rel=1e-6)


def test_zero_volume_is_the_compute_optimal_point(sweep):
    _, inputs, _, choices = sweep
    n_opt, d_opt = LAWS["epoch"].compute_optimal(inputs.loss)
    zero = choices[0]
    assert zero.volume == 0 and zero.serve_usd == 0
    assert zero.point.params == pytest.approx(n_opt, rel=0.02)
    assert zero.point.tokens == pytest.approx(d_opt, rel=0.02 * 3)  # D follows N along the loss contour


def test_more_volume_never_a_larger_model_nor_less_over_training(sweep):
    """Within the discrete steps: a fleet is whole units, so at a volume where one size needs one more unit than
    the next smaller one, the optimum may step back up one size of the grid, never more."""
    _, _, points, choices = sweep
    step = max(a.params / b.params for a, b in zip(points, points[1:], strict=False))
    ok = [c for c in choices if c.point]
    for a, b in zip(ok, ok[1:], strict=False):
        assert b.point.params <= a.point.params * step * (1 + 1e-9)
    for a, b in zip(ok, ok[2:], strict=False):  # two volumes on, strictly no larger
        assert b.point.params <= a.point.params * (1 + 1e-9)
        assert b.point.tokens / b.point.params >= a.point.tokens / a.point.params * (1 - 1e-9)
    assert ok[-1].point.params < ok[0].point.params  # heavy traffic shrinks the model


def test_serving_cost_is_planner_plans_cost(sweep, catalog):
    """The serving $/h of the chosen size at a volume equals `planner plan`'s for that generated model on the
    scenario scaled to that volume."""
    from planner.catalog.scenario import resolve_scenario
    from planner.options import PlanOptions
    from planner.pipeline.lifetime import scaled
    from planner.pipeline.plan import make_plan
    from planner.studies.family import generate

    rs, inputs, _, choices = sweep
    c = choices[2]
    model = generate(catalog, "llama3", c.point.target_params)
    cat = replace(catalog, models={**catalog.models, model.id: model})
    sc = scaled(rs.scenario.model_copy(update={"model": model.id}), c.volume)
    plan = make_plan(resolve_scenario(sc, cat, SCENARIO), PlanOptions(analysis=False)).plan
    assert c.serve_usd == pytest.approx(plan.objective.usd_per_hour * inputs.life_days * 24, rel=1e-6)


from tests.test_brownfield import _run  # noqa: E402


@pytest.mark.parametrize("args,says", [
    (["--loss", "1.5"], "irreducible"),
    (["--loss", "1.83"], "beyond"),
    (["--loss", "2.0", "--volumes", "-5,10"], "--volumes"),
    (["--loss", "2.0", "--mfu", "1.5"], "--mfu"),
    (["--loss", "2.0", "--family", "mistral"], "--family"),
    (["--loss", "2.0", "--family", "llama3", "--experts", "64"], "--experts"),
    (["--loss", "2.0", "--sparse-exponent", "1.5"], "--sparse-exponent"),
    (["--loss", "2.0", "--train-price", "-2"], "--train-price"),
    (["--loss", "2.0", "--life-days", "0"], "--life-days"),
    (["--loss", "2.0", "--unique-tokens", "-1"], "--unique-tokens"),
    (["--as-good-as", "70e9"], "--as-good-as"),
])
def test_bad_lifetime_input(tmp_path, capsys, args, says):
    code = _run(["lifetime", SCENARIO, "--out", tmp_path / "o", *args])
    err = capsys.readouterr().err
    assert code == 1 and says in err and "Traceback" not in err, err


def test_no_size_fits_is_exit_2(tmp_path, capsys):
    # a loss whose models run from 0.55T to 3T parameters: none fits one H100 node (640 GB), the scenario's limit
    doc = SCENARIO.read_text().replace("hardware: [h100-sxm, h200-sxm, b200-sxm, mi300x, mi355x]", "hardware: [h100-sxm]")
    path = tmp_path / "s.yaml"
    path.write_text(doc + "limits:\n  max_units: {h100-sxm: 1}\n")
    code = _run(["lifetime", path, "--loss", "1.86", "--volumes", "1e10", "--out", tmp_path / "o"])
    err = capsys.readouterr().err
    assert code == 2 and "no size" in err and "Traceback" not in err, err


def test_lifetime_cli_writes_markdown_plot_and_json(tmp_path, capsys, monkeypatch):
    from planner.pipeline import lifetime as lt

    monkeypatch.setattr(lt, "GRID_POINTS", 4)
    code = _run(["lifetime", SCENARIO, "--as-good-as", "8e9,15e12", "--volumes", "0,1e11", "--out", tmp_path / "o",
                 "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [f["family"] for f in doc["families"]] == ["llama3", "qwen3-moe"]  # dense and MoE by default
    for fam in doc["families"]:
        assert len(fam["rows"]) == 2 and fam["rows"][0]["overtrain"] == pytest.approx(1.0, rel=0.05)
        assert math.isfinite(fam["rows"][1]["total_usd"])
    moe = doc["families"][1]["rows"][1]
    assert moe["active_params"] < 0.2 * moe["params"]
    md = (tmp_path / "o" / "lifetime.md").read_text()
    assert "x Chinchilla" in md and "qwen3-moe (MoE)" in md and (tmp_path / "o" / "lifetime.png").stat().st_size > 1000
