"""``CaseWeighting.weights_before_loss``: the step weights a scheme knows before the batch's
losses (so that the trainer need not wait for the forward pass on the host). The contract: None,
or exactly what :meth:`weights` returns for *any* losses, NaN and inf included. One table of
schemes, each with what it must answer."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nnunet_dro.weighting import (
    AdaptiveHardnessWeighting,
    Chi2HardnessWeighting,
    FixedWeighting,
    GroupBalancedWeighting,
    GroupDROWeighting,
    HardnessWeighting,
    ImportanceWeights,
    KLReweighting,
)

N = 6
GROUPS = ["a", "a", "a", "b", "b", "c"]
OFF = ImportanceWeights(enabled=False)

#: (id, factory, known before the losses?)
SCHEMES = [
    ("kl, importance weights on (Algorithm 1)", lambda: HardnessWeighting(N, beta=10.0, seed=0), False),
    ("kl, importance weights off", lambda: HardnessWeighting(N, beta=10.0, importance=OFF, seed=0), True),
    ("kl, in the uniform warm-up pass", lambda: HardnessWeighting(N, beta=10.0, warmup=True, seed=0), True),
    ("adaptive, importance weights off (the default)",
     lambda: AdaptiveHardnessWeighting(N, importance=OFF, seed=0), True),
    ("adaptive, importance weights on", lambda: AdaptiveHardnessWeighting(N, seed=0), False),
    ("chi2, importance weights on", lambda: Chi2HardnessWeighting(N, seed=0), False),
    ("fixed case weights", lambda: FixedWeighting(np.arange(1.0, N + 1)), True),
    ("group-balanced", lambda: GroupBalancedWeighting(GROUPS, seed=0), True),
    ("group DRO (q moves with the losses)", lambda: GroupDROWeighting(GROUPS, eta=0.5, seed=0), False),
    ("KL reweighting", lambda: KLReweighting(N, seed=0), False),
]

losses_st = st.lists(st.one_of(st.floats(-3, 3), st.sampled_from([np.nan, np.inf, -np.inf])), min_size=3, max_size=3)


@pytest.mark.parametrize("make, known", [s[1:] for s in SCHEMES], ids=[s[0] for s in SCHEMES])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(losses=losses_st, history=st.lists(st.floats(-3, 3), min_size=N // 2, max_size=N // 2))
def test_known_weights_equal_the_weights_of_any_losses(make, known, losses, history):
    scheme = make()
    try:
        scheme.update(np.arange(N // 2), history)  # away from the initial state; a warm-up pass half done
        idx, beta = scheme.sample_with_beta(3)
        draw_beta = np.full(3, beta)
        before = scheme.weights_before_loss(idx, draw_beta)
        assert (before is not None) == known
        if before is not None:
            np.testing.assert_array_equal(before, scheme.weights(idx, losses, draw_beta))
    finally:
        if hasattr(scheme, "close"):
            scheme.close()


def test_the_warm_up_pass_knows_its_weights_until_it_ends():
    scheme = HardnessWeighting(4, beta=10.0, warmup=True, seed=0)
    try:
        assert scheme.weights_before_loss([0, 1]) is not None
        scheme.update(np.arange(4), [0.1, 0.2, 0.3, 0.4])  # every case seen once: the pass is over
        assert not scheme.in_warmup and scheme.weights_before_loss([0, 1]) is None
    finally:
        scheme.close()


@pytest.mark.parametrize("indices, error", [([0, 6], IndexError), ([0.5], ValueError)],
                         ids=["out of range", "not integers"])
def test_bad_indices_are_refused_as_by_weights(indices, error):
    with GroupBalancedWeighting(GROUPS, seed=0) as scheme, pytest.raises(error):
        scheme.weights_before_loss(indices)
    scheme = HardnessWeighting(N, importance=OFF, seed=0)
    try:
        with pytest.raises(error):
            scheme.weights_before_loss(indices)
    finally:
        scheme.close()
