"""Learner telemetry, one log window at a time: the seed's b/(a+b) made visible.

Each log window splits the learner's wall time into
- busy: forward + loss + backward + clip + optimizer step (until its stats are read back),
- wait: blocked because no batch was ready,
- overhead: everything else (publishing weights, bookkeeping, logging),
so the three fractions sum to 1 by construction.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class Window:
    start: float = field(default_factory=time.perf_counter)
    busy_s: float = 0.0
    wait_s: float = 0.0
    updates: int = 0
    frames: int = 0
    agent_steps: int = 0
    stats_sum: np.ndarray | None = None
    lags: list[int] = field(default_factory=list)
    replay_lags: list[int] = field(default_factory=list)
    gpu_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)


class Telemetry:
    def __init__(self, stat_names: tuple[str, ...], cuda: bool):
        self.stat_names = stat_names
        self.cuda = cuda
        self.window = Window()
        self.episode_returns: collections.deque[float] = collections.deque(maxlen=100)
        self.episode_lengths: collections.deque[int] = collections.deque(maxlen=100)
        self.episodes = 0
        self.lag_counts = np.zeros(1, dtype=np.int64)  # whole-run histogram, bin k = lag k
        # The latest network-health measurement (``health.measure``): each metrics line
        # carries the newest one, so a line logged between measurements repeats it.
        self.health: dict[str, float] = {}

    def add_update(
        self,
        stats: np.ndarray,
        lags: np.ndarray,
        frames: int,
        steps: int,
        replay_lags: np.ndarray | None = None,
    ) -> None:
        """``lags``: the fresh trajectories' policy lags; ``replay_lags``: the replayed ones',
        reported apart (``replay_lag_*``) and kept out of the policy-lag histogram."""
        w = self.window
        if replay_lags is not None:
            w.replay_lags.extend(replay_lags.tolist())
        w.updates += 1
        w.frames += frames
        w.agent_steps += steps
        w.stats_sum = stats if w.stats_sum is None else w.stats_sum + stats
        w.lags.extend(lags.tolist())
        counts = np.bincount(np.clip(lags, 0, None).astype(np.int64))
        if len(counts) > len(self.lag_counts):
            self.lag_counts = np.pad(self.lag_counts, (0, len(counts) - len(self.lag_counts)))
        self.lag_counts[: len(counts)] += counts

    def lag_histogram(self) -> dict[str, list[int]]:
        """The whole run's per-sample policy lag: ``counts[k]`` samples had lag ``bins[k]``."""
        return {"bins": list(range(len(self.lag_counts))), "counts": self.lag_counts.tolist()}

    def episode_record(self) -> dict[str, Any]:
        """The episodes and lags so far, as a checkpoint keeps them (``load_episode_record``)."""
        return {
            "episode_returns": list(self.episode_returns),
            "episode_lengths": list(self.episode_lengths),
            "episodes": self.episodes,
            "lag_counts": self.lag_counts.copy(),
        }

    def load_episode_record(self, saved: dict[str, Any]) -> None:
        """Go on from a checkpoint's ``episode_record``."""
        self.episode_returns.extend(saved["episode_returns"])
        self.episode_lengths.extend(saved["episode_lengths"])
        self.episodes = saved["episodes"]
        self.lag_counts = np.asarray(saved["lag_counts"], dtype=np.int64)

    def mean_return(self) -> float | None:
        """The mean over the last 100 episodes; None before the first ends."""
        return float(np.mean(self.episode_returns)) if self.episode_returns else None

    def add_episodes(self, episodes: list[tuple[float, int]]) -> None:
        for ret, length in episodes:
            self.episode_returns.append(ret)
            self.episode_lengths.append(length)
            self.episodes += 1

    def reached(self, target: float | None) -> bool:
        """Whether the mean return over a full window of the last 100 episodes is >= ``target``
        (a part-full window is too noisy to stop on; ``None`` never stops)."""
        window = self.episode_returns
        full = window.maxlen is not None and len(window) == window.maxlen
        return target is not None and full and float(np.mean(window)) >= target

    def flush(self) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Scalars for the window since the last flush, plus the lag histogram samples."""
        w = self.window
        now = time.perf_counter()
        wall = max(now - w.start, 1e-9)
        out: dict[str, float] = {
            "window_s": wall,
            "updates_per_s": w.updates / wall,
            "agent_steps_per_s": w.agent_steps / wall,
            "frames_per_s": w.frames / wall,
            "learner_busy": w.busy_s / wall,
            "learner_wait": w.wait_s / wall,
        }
        out["learner_overhead"] = max(0.0, 1.0 - out["learner_busy"] - out["learner_wait"])
        if w.stats_sum is not None and w.updates:
            for name, v in zip(self.stat_names, w.stats_sum / w.updates, strict=True):
                out[name] = float(v)
        if w.lags:
            lags = np.asarray(w.lags)
            out["policy_lag_mean"] = float(lags.mean())
            out["policy_lag_p95"] = float(np.percentile(lags, 95))
            out["policy_lag_max"] = float(lags.max())
        if w.replay_lags:
            replay = np.asarray(w.replay_lags)
            out["replay_lag_mean"] = float(replay.mean())
            out["replay_lag_max"] = float(replay.max())
        mean_return = self.mean_return()
        out["episode_return"] = float("nan") if mean_return is None else mean_return
        out["episode_length"] = (
            float(np.mean(self.episode_lengths)) if self.episode_lengths else float("nan")
        )
        out["episodes"] = self.episodes
        if self.cuda and w.gpu_events:
            gpu_ms = sum(s.elapsed_time(e) for s, e in w.gpu_events)
            out["gpu_busy"] = min(1.0, gpu_ms / 1000.0 / wall)
            out["gpu_mem_allocated_gb"] = torch.cuda.memory_allocated() / 2**30
            out["gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        hist = {"policy_lag_hist": [float(x) for x in w.lags]}
        self.window = Window(start=now)
        return out, hist
