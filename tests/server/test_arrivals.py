from __future__ import annotations

import numpy as np
import pytest

from specscale.server.arrivals import arrival_times


def test_saturated_and_poisson():
    assert arrival_times(3, "saturated") == [0.0, 0.0, 0.0]
    a = arrival_times(2000, "poisson", rate=4.0, seed=1)
    assert a == arrival_times(2000, "poisson", rate=4.0, seed=1)
    assert a != arrival_times(2000, "poisson", rate=4.0, seed=2)
    assert np.all(np.diff(a) >= 0)
    assert np.mean(np.diff(a)) == pytest.approx(0.25, rel=0.1)
    with pytest.raises(ValueError):
        arrival_times(3, "poisson", rate=0)
    with pytest.raises(ValueError):
        arrival_times(3, "bursty")
