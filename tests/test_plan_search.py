"""`PlanSearch` on simulated plans: closed-form peaks, no backend."""

import math

import pytest

from kadapt.batching.plan_search import PlanSearch
from kadapt.batching.probe import MARGIN
from kadapt.batching.probe import ProbeTrial

FIXED, PER_ROW = 3_000_000, 50_000


def search_of(peak, budget):
    def runner(size):
        return ProbeTrial(size, int(peak(size)), None, peak(size) <= budget)

    return PlanSearch(runner, budget)


def test_a_straight_line_gives_the_margin_size_in_three_plans():
    budget = 20_000_000
    search = search_of(lambda m: FIXED + PER_ROW * m, budget)
    expected = math.floor((budget - FIXED) * (1 - MARGIN) / PER_ROW)  # 323
    assert search.largest(cap=4096) == expected
    assert len(search.trials) == 3


@pytest.mark.parametrize("budget", [9_000_000, 20_000_000, 70_000_000])
def test_a_bent_curve_gives_a_planned_size_within_the_budget(budget):
    def peak(m):  # steps up every 64 rows, as XLA's tiling can
        return FIXED + PER_ROW * m + 400_000 * (m // 64)

    search = search_of(peak, budget)
    chosen = search.largest(cap=4096)
    assert chosen in {t.micro_batch_size for t in search.trials}
    assert peak(chosen) <= budget
    assert chosen >= 0.85 * max(m for m in range(1, 4097) if peak(m) <= budget)


def test_the_cap_is_taken_when_everything_fits():
    search = search_of(lambda m: FIXED + PER_ROW * m, 10**12)
    assert search.largest(cap=100) == 100


def test_a_first_size_over_the_budget_is_divided():
    budget = FIXED + PER_ROW * 6
    search = search_of(lambda m: FIXED + PER_ROW * m, budget)
    assert search.largest(cap=4096) == 5  # 95% of the room of 6 rows
    assert [t.micro_batch_size for t in search.trials][:2] == [16, 4]


def test_a_budget_under_one_row_is_an_error():
    search = search_of(lambda m: FIXED + PER_ROW * m, FIXED)
    with pytest.raises(ValueError, match="Argument `memory_budget` is smaller than one sample's training step"):
        search.largest(cap=4096)


def test_a_logical_batch_is_planned_only_at_sizes_it_trains_as():
    from kadapt.batching.batch_plan import balanced_micro_batch

    budget, logical = 5_500_000, 256

    def peak(m):
        return FIXED + PER_ROW * m

    search = PlanSearch(lambda m: ProbeTrial(m, peak(m), None, peak(m) <= budget), budget,
                        lambda m: balanced_micro_batch(logical, m))
    chosen = search.largest(cap=logical)
    planned = [t.micro_batch_size for t in search.trials]
    assert all(balanced_micro_batch(logical, m) == m for m in planned)
    assert len(planned) == len(set(planned))
    margin_rows = (budget - FIXED) * (1 - MARGIN) / PER_ROW  # 47.5
    assert chosen == max(m for m in range(1, logical + 1)
                         if balanced_micro_batch(logical, m) == m and m <= margin_rows)  # 43
