"""A sample of benchmarks/elastic_trials.py's 100 randomised kill/join
trials (that script runs them all and reports the leak counts). Each trial
is drawn from its seed; every finishing rank is checked against the
trial's plain-Python oracle (the members and total of every step, the
state, the final membership, the ranks the launcher reports lost) and for
threads or file descriptors that grow from one membership to a later one
of the same size.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(150)]


def _trials():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import elastic_trials

    return elastic_trials


#: seed -> what it draws: a member killed while admitting the first victim's
#: replacement; a joiner with other shapes refused by 3 members (the pause
#: that left members apart); rank 0 killed and its first replacement dying
#: while joining (the half-made group that lived until a collection)
SAMPLE = {
    6: "4 ranks: rank 3 killed before step 2, rank 2 dies admitting its replacement",
    5: "4 ranks: rank 2 killed before step 5, its replacement refused (other shapes)",
    0: "3 ranks: rank 0 killed after step 2, its first replacement dies joining",
}


@pytest.mark.parametrize("seed", sorted(SAMPLE))
def test_a_drawn_trial_ends_equal_to_the_oracle_with_nothing_left_behind(seed: int):
    trials = _trials()
    trial = trials.draw(seed)
    problems, _, usages = trials.run_trial(trial)
    assert problems == [], (SAMPLE[seed], trial)
    assert usages  # the ranks that finished reported their counts
