"""Atari-5: an estimate of the Atari-57 median human-normalised score from five games.

Source: M. Aitchison, P. Sweetser and M. Hutter, "Atari-5: Distilling the Arcade Learning
Environment down to Five Games", ICML 2023 (PMLR 202:421-438; arXiv:2210.02019), and its code,
github.com/maitchison/Atari-5 at commit ``118cad542c94bc6e57181bb259a17d020e0a330f``
(``atari5.py``, ``Atari-Human.csv``, ``dataset.csv``).

What the paper's regression is, restated here:

- **Normalisation.** For each game, ``HNS = 100 * (score - random) / (human - random)``, in
  percent, with ``random`` and ``human`` from the ``Random`` and ``Human`` columns of the repo's
  ``Atari-Human.csv`` (not its ``DQN_Random`` column).
- **Transform.** ``t(x) = log10(1 + max(x, 0))``: a score below random counts as random.
- **Model.** ``t(median57) ~ sum_g w_g * t(HNS_g)`` by ordinary least squares *without an
  intercept* (so five random-level scores give an estimate of exactly 0), over the algorithms
  in the repo's dataset that report at least 40 of the 57 games and have a 57-game median
  above 40% (``is_good`` in ``atari5.py``); 44 of them have all five Atari-5 games. The target
  is the median HNS over the canonical 57 games each algorithm reports.
- **Estimate.** ``10 ** (sum_g w_g * t(HNS_g)) - 1``, in percent of human.
- **Error.** The paper's "within 10%": the 10-fold cross-validated mean absolute error of the
  log10 fit, times ``ln 10``, as a percentage: 10.4% for this subset.

The weights below are those the authors use in their own code (maitchison/PPO,
``tools/plot_util.py`` at ``01210ae67212d0d5f9cfce8a06774fd6c44940bd``, ``SUBSETS['Atari_5']``).
We re-ran the repo's own fit (``atari5.fit_model`` / ``RegressionEvaluation`` for exactly this
subset, ``USE_UPDATED_A3C = False`` and ``USE_RAINBOW_RIVERRAID = True`` as committed, the
committed ``PapersWithCode.csv``) and got the same five weights to within 1e-15, over 44
algorithms, cross-validated relative error 10.43%, R^2 0.988 (docs/results/atari5.md says how).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

SOURCE_PAPER = (
    "Aitchison, Sweetser and Hutter, 'Atari-5: Distilling the Arcade Learning Environment down "
    "to Five Games', ICML 2023"
)
SOURCE_REPO = "github.com/maitchison/Atari-5"
SOURCE_COMMIT = "118cad542c94bc6e57181bb259a17d020e0a330f"
#: The paper's stated accuracy for Atari-5: the cross-validated mean relative error, percent.
RELATIVE_ERROR_PERCENT = 10.4
#: Algorithms with all five games that the regression was fitted on.
FIT_ALGORITHMS = 44


@dataclass(frozen=True)
class Atari5Game:
    """One of the five games: its names, the scores that normalise it, and its weight.

    Attributes:
        key: the repo's spelling (lower case, letters only), e.g. ``"battlezone"``.
        title: how the game is written in prose, e.g. ``"Battle Zone"``.
        env_id: the gymnasium/ale-py id, e.g. ``"ALE/BattleZone-v5"``.
        random: the random agent's score (``Atari-Human.csv``, column ``Random``).
        human: the human tester's score (``Atari-Human.csv``, column ``Human``).
        weight: the game's coefficient in the log-space regression.
    """

    key: str
    title: str
    env_id: str
    random: float
    human: float
    weight: float


#: The five games in the paper's order.
ATARI5: tuple[Atari5Game, ...] = (
    Atari5Game(
        "battlezone", "Battle Zone", "ALE/BattleZone-v5", 2360.0, 37187.5, 0.3819751237831753
    ),
    Atari5Game("doubledunk", "Double Dunk", "ALE/DoubleDunk-v5", -18.55, -16.4, 0.0679099488887574),
    Atari5Game(
        "namethisgame", "Name This Game", "ALE/NameThisGame-v5", 2292.35, 8049.0, 0.310804148620847
    ),
    Atari5Game("phoenix", "Phoenix", "ALE/Phoenix-v5", 761.4, 7242.6, 0.12412619402774641),
    Atari5Game("qbert", "Q*bert", "ALE/Qbert-v5", 163.88, 13455.0, 0.08048518286466755),
)

_BY_KEY = {g.key: g for g in ATARI5}
ATARI5_ENV_IDS: tuple[str, ...] = tuple(g.env_id for g in ATARI5)


def game_key(name: str) -> str:
    """The repo's key for a game named any usual way: ``"ALE/BattleZone-v5"``,
    ``"BattleZoneNoFrameskip-v4"``, ``"Battle Zone"``, ``"Q*bert"`` -> ``"battlezone"``/``"qbert"``.

    Only strips an env id's namespace and version and keeps letters; it does not check that
    the game is one of the five (``atari5_game`` does).
    """
    base = name.rsplit("/", 1)[-1]
    base = re.sub(r"(NoFrameskip|Deterministic)?-v\d+$", "", base)
    return "".join(c for c in base.lower() if c.isalpha())


def atari5_game(name: str) -> Atari5Game:
    """The Atari-5 game ``name`` refers to (any spelling ``game_key`` accepts).

    Raises:
        KeyError: ``name`` is not one of the five games, naming them.
    """
    key = game_key(name)
    if key not in _BY_KEY:
        raise KeyError(f"{name!r} is not an Atari-5 game; the five are {', '.join(ATARI5_ENV_IDS)}")
    return _BY_KEY[key]


def human_normalized(game: str, score: float) -> float:
    """The human-normalised score of ``score`` on ``game``, in percent: 0 is the random
    agent's score, 100 the human tester's, as the Atari-5 repo normalises (unclipped: a score
    below random is negative here; the regression clips it, ``log_score``)."""
    g = atari5_game(game)
    return 100.0 * (score - g.random) / (g.human - g.random)


def log_score(hns: float) -> float:
    """The paper's transform of a human-normalised score (percent): ``log10(1 + max(hns, 0))``.
    Clipping at 0 keeps the log defined and treats any below-random play as random play."""
    return math.log10(1.0 + max(hns, 0.0))


def atari5_median_estimate(scores: Mapping[str, float]) -> float:
    """The Atari-5 estimate of the Atari-57 median human-normalised score, in percent.

    Args:
        scores: raw game scores (not normalised) for all five games, keyed by any spelling
            ``game_key`` accepts (``"ALE/Qbert-v5"``, ``"qbert"``, ``"Q*bert"``...). Extra
            games are ignored.

    Returns:
        ``10 ** sum_g(w_g * log_score(HNS_g)) - 1``; NaN when any of the five scores is NaN.
        The paper puts its typical error at about 10% of the value (``RELATIVE_ERROR_PERCENT``).

    Raises:
        KeyError: a game is missing (naming it), or two keys name the same game.
    """
    by_key: dict[str, float] = {}
    for name, score in scores.items():
        key = game_key(name)
        if key in by_key:
            raise KeyError(f"two scores for {key!r}")
        by_key[key] = float(score)
    missing = [g.env_id for g in ATARI5 if g.key not in by_key]
    if missing:
        raise KeyError(f"the Atari-5 estimate needs all five games; missing {', '.join(missing)}")
    total = 0.0
    for g in ATARI5:
        score = by_key[g.key]
        if math.isnan(score):
            return math.nan
        total += g.weight * log_score(human_normalized(g.key, score))
    return 10.0**total - 1.0
