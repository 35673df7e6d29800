"""The toy lab's default comparison runs as many seeds as its Prediction 1 needs: the sign-test interval of the median
steps to the threshold at the level of the page's prediction table (issue 57: it ran 8 where the test needs 10)."""

from __future__ import annotations

import numpy as np

from dfpo.app import data
from dfpo.core import stats
from dfpo.toy.checks import PREDICTIONS, checks
from dfpo.toy.config import ToyConfig


def _summary(labels: tuple[str, ...], seeds: int) -> dict:
    """Every prediction's key for every label over ``seeds`` seeds, every run reaching the threshold (no censoring)."""
    rng = np.random.default_rng(0)
    return {label: {**{key: rng.uniform(10, 20, seeds) for key, _, _ in PREDICTIONS}, "reached": np.ones(seeds, bool)} for label in labels}


def _prediction_1(labels: tuple[str, ...], seeds: int) -> list:
    rows = checks(_summary(labels, seeds), ToyConfig(objectives=labels, seeds=seeds))
    return [r.interval for r in rows if r.key == "steps_to_kappa"]


def test_the_default_seeds_are_the_fewest_that_give_prediction_1_its_median_interval():
    """Invariant: at the default seeds every Prediction 1 row is the median's sign-test interval with finite ends; one
    seed fewer and the table can only fall back to the mean's t-interval."""
    default = data.TOY_DEFAULT
    assert default.seeds == data.prediction_seeds(default.labels) >= 10
    enough = _prediction_1(default.labels, default.seeds)
    assert enough and all(isinstance(iv, stats.CensoredInterval) and np.isfinite([iv.low, iv.high]).all() for iv in enough)
    fewer = _prediction_1(default.labels, default.seeds - 1)
    assert fewer and all(isinstance(iv, stats.Interval) for iv in fewer)


def test_the_seeds_prediction_1_needs_grow_with_the_checks_the_table_adjusts_for():
    assert data.prediction_seeds(("gspo", "dfpo_min")) <= data.prediction_seeds(data.TOY_LABELS)
    assert data.prediction_seeds(("gspo",)) == stats.sign_test_min_seeds(0.95)  # no pair, no check: one test's level
