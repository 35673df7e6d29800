"""cor-3.2-params: eq 5's equal-coefficient pair in parameter space, symbolic and through the core probe."""

from __future__ import annotations

import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.theory.param_drift import probed_pair, symbolic_drift


def test_the_symbolic_drift_is_the_gram_closed_form():
    drift, closed = symbolic_drift()
    assert sp.simplify(drift - closed) == 0


def test_a_tabular_softmax_keeps_the_log_odds_of_equal_coefficients():
    coef, predicted, measured, closed = probed_pair(torch.eye(3, dtype=torch.float64))
    assert coef == 0 and closed == 0 and abs(predicted) < 1e-12 and abs(measured) < 1e-9


def test_a_wrong_answer_sharing_a_feature_drags_that_answer_down():
    features = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]], dtype=torch.float64)
    coef, predicted, measured, closed = probed_pair(features)
    assert coef == 0 and closed < 0
    assert abs(predicted - closed) < 1e-12 and abs(measured - closed) < 1e-3 * abs(closed)


@settings(max_examples=20, deadline=None)
@given(st.floats(0.2, 3.0), st.integers(0, 2**31 - 1))
def test_orthogonal_equal_norm_features_never_drift(scale, seed):
    """Orthogonal outputs' features of one norm (any rotation of a scaled identity) give no first-order drift."""
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    _, predicted, _, closed = probed_pair(scale * q)
    assert abs(closed) < 1e-12 and abs(predicted) < 1e-12
