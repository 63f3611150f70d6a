"""The Atari-5 estimate (impala_gpu/analysis/atari5.py) against the Atari-5 repo's own data.

Every raw score and 57-game median below is taken from the repo's ``dataset.csv``
(github.com/maitchison/Atari-5 at 118cad542c94bc6e57181bb259a17d020e0a330f: the rows the
regression was fitted on, one per algorithm and game). ``REPO_FIT`` is what the repo's own
fitted model (``atari5.fit_model`` for exactly these five games) predicts for that algorithm;
``MEDIAN_57`` the median of its human-normalised scores over the 57 games it reports.
"""

from __future__ import annotations

import math

import pytest

from impala_gpu.analysis.atari5 import (
    ATARI5,
    ATARI5_ENV_IDS,
    RELATIVE_ERROR_PERCENT,
    atari5_game,
    atari5_median_estimate,
    game_key,
    human_normalized,
    log_score,
)

GAMES = ("battlezone", "doubledunk", "namethisgame", "phoenix", "qbert")

# algorithm (its source CSV in the repo): (five raw scores in GAMES order, MEDIAN_57, REPO_FIT)
PUBLISHED = {
    "Rainbow (noop) (RAINBOW (fixed).csv)": (
        (62010.0, -0.3, 13136.0, 108528.6, 33817.5),
        227.0478235093978,
        225.1046152035643,
    ),
    "Reactor (REACTOR.csv)": (
        (61220.0, 11.4, 9907.2, 40092.2, 22956.5),
        186.83452394894027,
        177.42670913836417,
    ),
    "MuZero (PapersWithCode.csv)": (
        (848623.0, 23.94, 157177.85, 955137.84, 72276.0),
        2041.1209480655284,
        2091.6083075864176,
    ),
    "Duel DDQN (noop) (RAINBOW (fixed).csv)": (
        (37150.0, 0.1, 11971.1, 23092.2, 19220.3),
        142.3141973182439,
        139.09999243948482,
    ),
    # IMPALA (deep), 200M frames: the regression over-estimates it by 18%, outside the paper's
    # ~10%; it is here to check we reproduce the repo's prediction, misses included.
    "IMPALA (deep) (PapersWithCode.csv)": (
        (20885.0, -0.33, 21537.2, 210996.45, 351200.12),
        191.8203738800061,
        226.7000337397534,
    ),
    # The human tester's own scores (SEED.csv's "Human Ref"): 100% on every game.
    "Human Ref (SEED.csv)": ((37187.5, -16.4, 8049.0, 7242.6, 13455.0), 100.0, 85.05430888488843),
}


@pytest.mark.parametrize("algo", list(PUBLISHED))
def test_the_estimate_is_the_repos_own_fitted_prediction(algo: str) -> None:
    scores, _, repo_fit = PUBLISHED[algo]
    estimate = atari5_median_estimate(dict(zip(GAMES, scores, strict=True)))
    assert estimate == pytest.approx(repo_fit, rel=1e-9)


@pytest.mark.parametrize(
    "algo", ["Rainbow (noop) (RAINBOW (fixed).csv)", "Reactor (REACTOR.csv)",
             "MuZero (PapersWithCode.csv)", "Duel DDQN (noop) (RAINBOW (fixed).csv)"],
)  # fmt: skip
def test_published_algorithms_medians_within_the_papers_error(algo: str) -> None:
    """The paper's claim (~10% of the true 57-game median), on algorithms it fitted on."""
    scores, median_57, _ = PUBLISHED[algo]
    estimate = atari5_median_estimate(dict(zip(GAMES, scores, strict=True)))
    assert abs(estimate - median_57) / median_57 * 100 < RELATIVE_ERROR_PERCENT


def test_human_and_random_scores_normalise_to_100_and_0() -> None:
    for g in ATARI5:
        assert human_normalized(g.env_id, g.human) == pytest.approx(100.0)
        assert human_normalized(g.key, g.random) == pytest.approx(0.0, abs=1e-12)


def test_below_random_counts_as_random() -> None:
    """The transform clips a negative HNS to 0: worse than random is no worse than random."""
    random = {g.env_id: g.random for g in ATARI5}
    assert atari5_median_estimate(random) == 0.0  # no intercept: random play estimates 0
    worse = {g.env_id: g.random - abs(g.random) - 1000 for g in ATARI5}
    assert all(human_normalized(k, v) < 0 for k, v in worse.items())
    assert atari5_median_estimate(worse) == 0.0
    assert log_score(-250.0) == 0.0 and log_score(99.0) == pytest.approx(2.0)
    # One game below random moves the estimate exactly as that game at random would.
    human = {g.env_id: g.human for g in ATARI5}
    dunk_lost = {**human, "ALE/DoubleDunk-v5": -24.0}
    dunk_random = {**human, "ALE/DoubleDunk-v5": -18.55}
    assert atari5_median_estimate(dunk_lost) == atari5_median_estimate(dunk_random)
    assert atari5_median_estimate(dunk_lost) < atari5_median_estimate(human)


def test_spellings_missing_games_and_nan() -> None:
    assert [game_key(i) for i in ATARI5_ENV_IDS] == list(GAMES)
    assert game_key("QbertNoFrameskip-v4") == game_key("Q*bert") == "qbert"
    assert atari5_game("Name This Game").env_id == "ALE/NameThisGame-v5"
    with pytest.raises(KeyError, match="not an Atari-5 game"):
        human_normalized("ALE/Pong-v5", 21.0)
    partial = {"ALE/BattleZone-v5": 1e4, "qbert": 1e3}
    with pytest.raises(KeyError, match="DoubleDunk.*NameThisGame.*Phoenix"):
        atari5_median_estimate(partial)
    with pytest.raises(KeyError, match="two scores"):
        atari5_median_estimate({**{g.key: g.human for g in ATARI5}, "Q*bert": 0.0})
    with_nan = {g.env_id: g.human for g in ATARI5} | {"ALE/Phoenix-v5": math.nan}
    assert math.isnan(atari5_median_estimate(with_nan))
    extra = {g.env_id: g.human for g in ATARI5} | {"ALE/Pong-v5": 21.0}  # ignored
    assert atari5_median_estimate(extra) == pytest.approx(85.05430888488843)


def test_the_weights_are_the_published_ones() -> None:
    """Sum of the weights 0.965: at human level on all five the estimate is 101**0.965 - 1."""
    total = sum(g.weight for g in ATARI5)
    assert total == pytest.approx(0.9654, abs=1e-4)
    assert atari5_median_estimate({g.key: g.human for g in ATARI5}) == pytest.approx(101**total - 1)
