"""Tests that bite the Student-t fallback's neighbours in ``dfpo.core.stats`` (issue 57 item 11, mutation/realmodel.toml)."""

from __future__ import annotations

from dfpo.core.stats import paired_censored_interval, sign_test_min_seeds, unbounded_reason


def test_exactly_enough_seeds_with_every_pair_censored_blames_the_censoring_not_the_seed_count():
    """At exactly the sign test's seed count (6 at 95%) the seeds suffice: an interval censoring leaves open says so,
    and one seed fewer blames the seed count."""
    need = sign_test_min_seeds(0.95)
    assert need == 6
    both = paired_censored_interval([151.0] * need, [True] * need, [151.0] * need, [True] * need)
    assert unbounded_reason(both) == (
        "6 of 6 pairs have a run that never reached the threshold, and a censored pair bounds its difference on one side "
        "only: too few bounded pairs on either side for the sign test"
    )
    fewer = paired_censored_interval([151.0] * (need - 1), [True] * (need - 1), [151.0] * (need - 1), [True] * (need - 1))
    assert unbounded_reason(fewer) == "n = 5 seeds: a sign-test interval of the median at level 0.95 needs >= 6"
