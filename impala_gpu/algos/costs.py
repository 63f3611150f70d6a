"""Each algorithm's own cost model: how fast a candidate (precision, actors, envs) would run,
from ``auto``'s timings (``impala_gpu.calibration.model.CostModel``). The tuner asks these and
knows no algorithm by name."""

from __future__ import annotations

from impala_gpu.calibration.model import (
    ACTOR_COUNTS,
    Candidate,
    LearnerTiming,
    Timings,
    Workload,
)
from impala_gpu.speed.threads import learner_threads


class ImpalaCost:
    """Actors and a learner side by side: the slowest of three limits. The learner's update
    rate; the actors' stepping rate (one core each); and, for a CPU learner, the cores all of
    it shares (the learner takes its threads' cores while it updates). A CUDA learner's
    process needs about one core to feed the GPU."""

    cpu_only = False

    def actor_counts(self, cores: int) -> list[int]:
        return sorted({n for n in (*ACTOR_COUNTS, cores) if n <= max(cores, 1)})

    def batch(self, c: Candidate, w: Workload) -> int:
        return w.batch_size

    def learner_timing(self, c: Candidate, w: Workload) -> LearnerTiming:
        threads = learner_threads(
            w.device_type, c.precision, w.cores, c.num_actors, w.learner_threads
        )
        return c.precision, threads, self.batch(c, w)

    def predict(self, c: Candidate, t: Timings, w: Workload) -> float:
        T, B, cores = w.unroll_length, w.batch_size, w.cores
        per_step_actor = t.acting(c) / c.envs_per_actor  # core-seconds per agent step
        timing = self.learner_timing(c, w)
        threads, step = timing[1], t.learner(timing)
        learner_cap = T * B / step
        actor_cap = c.num_actors / per_step_actor
        if w.device_type == "cuda":
            cpu_cap = max(cores - 1, 1) / per_step_actor
        else:
            cpu_cap = cores / (threads * step / (T * B) + per_step_actor)
        return min(learner_cap, actor_cap, cpu_cap)


class A2CCost(ImpalaCost):
    """IMPALA's runtime behind a barrier: the actors act, then the learner learns on one unroll
    of every env, in turn; more actors than cores crowd each other while they act."""

    def batch(self, c: Candidate, w: Workload) -> int:
        return c.num_actors * c.envs_per_actor

    def predict(self, c: Candidate, t: Timings, w: Workload) -> float:
        T, B = w.unroll_length, self.batch(c, w)
        step = t.learner(self.learner_timing(c, w))
        crowding = max(1.0, c.num_actors / w.cores)
        return T * B / (T * t.acting(c) * crowding + step)


class A3CCost:
    """Hogwild workers on the CPU, each acting and then learning on its own envs' unroll on one
    core (one torch thread); as many run at once as there are cores."""

    cpu_only = True

    def actor_counts(self, cores: int) -> list[int]:
        return [cores]  # Mnih et al.: one worker per core (each learns on its own core)

    def learner_timing(self, c: Candidate, w: Workload) -> LearnerTiming:
        return c.precision, 1, c.envs_per_actor

    def predict(self, c: Candidate, t: Timings, w: Workload) -> float:
        T, E = w.unroll_length, c.envs_per_actor
        update = t.learner(self.learner_timing(c, w))
        return min(c.num_actors, w.cores) * T * E / (T * t.acting(c) + update)


IMPALA_COST = ImpalaCost()
A2C_COST = A2CCost()
A3C_COST = A3CCost()
