"""Tests for impala_gpu.envs: shapes, seeding, id validation and NEXT_STEP autoreset."""

from __future__ import annotations

import sys
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest

from impala_gpu.config import EnvCfg
from impala_gpu.envs import (
    ale_game_name,
    atari_ids,
    derive_seeds,
    env_spec,
    make_env,
    make_vector_env,
    reset_vector_env,
    validate_env_id,
)

PONG = "ALE/Pong-v5"
BREAKOUT = "ALE/Breakout-v5"
CARTPOLE = "CartPole-v1"
NUM_ENVS = 2


def _actions(step: int, num_envs: int, num_actions: int) -> np.ndarray:
    """A fixed, non-constant action sequence (different per sub-env)."""
    return np.array([(step * (j + 1) + j) % num_actions for j in range(num_envs)], dtype=np.int64)


def _vector_rollout(cfg: EnvCfg, seeds: list[int], steps: int, num_actions: int):
    """Reset with ``seeds``, step a fixed action sequence; stacked obs/rewards/flags."""
    env = make_vector_env(cfg, len(seeds))
    try:
        obs, _ = reset_vector_env(env, seeds)
        all_obs, rewards, terms, truncs = [obs], [], [], []
        for t in range(steps):
            obs, rew, term, trunc, _ = env.step(_actions(t, len(seeds), num_actions))
            all_obs.append(obs)
            rewards.append(np.asarray(rew, dtype=np.float64))
            terms.append(np.asarray(term))
            truncs.append(np.asarray(trunc))
    finally:
        env.close()
    return np.stack(all_obs), np.stack(rewards), np.stack(terms), np.stack(truncs)


def _single_rollout(cfg: EnvCfg, seed: int, steps: int, num_actions: int):
    env = make_env(cfg, seed=seed)
    try:
        obs, _ = env.reset()
        all_obs, rewards = [np.asarray(obs)], []
        for t in range(steps):
            obs, rew, term, trunc, _ = env.step(int(_actions(t, 1, num_actions)[0]))
            all_obs.append(np.asarray(obs))
            rewards.append(float(rew))
            if term or trunc:
                obs, _ = env.reset()
                all_obs.append(np.asarray(obs))
    finally:
        env.close()
    return np.stack(all_obs), np.asarray(rewards)


# --------------------------------------------------------------------------- shapes and specs


def test_make_env_pong_shape_dtype():
    env = make_env(EnvCfg(id=PONG), seed=0)
    try:
        assert env.observation_space.shape == (4, 84, 84)
        assert env.observation_space.dtype == np.uint8
        obs, _ = env.reset()
        obs = np.asarray(obs)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        obs, *_ = env.step(0)
        obs = np.asarray(obs)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert env.action_space.n == 6
    finally:
        env.close()


def test_make_env_cartpole_shape_dtype():
    env = make_env(EnvCfg(id=CARTPOLE), seed=0)
    try:
        obs, _ = env.reset()
        assert obs.shape == (4,) and obs.dtype == np.float32
        obs, *_ = env.step(1)
        assert obs.shape == (4,) and obs.dtype == np.float32
        assert env.action_space.n == 2
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id,backend,shape,dtype",
    [
        (PONG, "ale", (4, 84, 84), np.uint8),
        (PONG, "gymnasium", (4, 84, 84), np.uint8),
        (CARTPOLE, "gymnasium", (4,), np.float32),
    ],
)
def test_vector_env_shapes(env_id, backend, shape, dtype):
    env = make_vector_env(EnvCfg(id=env_id, vector_backend=backend), 3)
    try:
        obs, _ = reset_vector_env(env, [1, 2, 3])
        assert obs.shape == (3, *shape) and obs.dtype == dtype
        obs, rew, term, trunc, _ = env.step(np.zeros(3, dtype=np.int64))
        assert obs.shape == (3, *shape) and obs.dtype == dtype
        assert np.shape(rew) == (3,) and np.shape(term) == (3,) and np.shape(trunc) == (3,)
    finally:
        env.close()


def test_vector_backend_auto_and_ale_on_classic():
    from ale_py import AtariVectorEnv

    env = make_vector_env(EnvCfg(id=PONG), 1)  # auto -> ale for Atari
    try:
        assert isinstance(env.unwrapped, AtariVectorEnv)
    finally:
        env.close()
    env = make_vector_env(EnvCfg(id=CARTPOLE), 1)  # auto -> gymnasium for classic control
    try:
        assert isinstance(env.unwrapped, gym.vector.SyncVectorEnv)
    finally:
        env.close()
    with pytest.raises(ValueError, match="vector_backend"):
        make_vector_env(EnvCfg(id=CARTPOLE, vector_backend="ale"), 1)
    with pytest.raises(ValueError, match="vector_backend"):
        make_vector_env(EnvCfg(id=CARTPOLE, vector_backend="envpool"), 1)


@pytest.mark.parametrize(
    "env_id,kind,obs_shape,dtype,num_actions,frames_per_step",
    [
        (PONG, "atari", (4, 84, 84), np.uint8, 6, 4),
        (CARTPOLE, "classic", (4,), np.float32, 2, 1),
    ],
)
def test_env_spec(env_id, kind, obs_shape, dtype, num_actions, frames_per_step):
    spec = env_spec(EnvCfg(id=env_id))
    assert spec.id == env_id
    assert spec.kind == kind
    assert spec.obs_shape == obs_shape
    assert spec.obs_dtype == np.dtype(dtype)
    assert spec.num_actions == num_actions
    assert spec.frames_per_step == frames_per_step


def test_env_spec_frames_per_step_follows_frame_skip():
    assert env_spec(EnvCfg(id=PONG, frame_skip=2)).frames_per_step == 2


# --------------------------------------------------------------------------- seeding


@pytest.mark.parametrize("backend", ["ale", "gymnasium"])
def test_pong_vector_seeding_reproduces(backend):
    cfg = EnvCfg(id=PONG, vector_backend=backend, noop_max=30)
    obs_a, rew_a, _, _ = _vector_rollout(cfg, [11, 12], 50, 6)
    obs_b, rew_b, _, _ = _vector_rollout(cfg, [11, 12], 50, 6)
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rew_a, rew_b)
    obs_c, _, _, _ = _vector_rollout(cfg, [21, 22], 50, 6)
    # Different seeds -> different no-op starts -> every sub-env's trajectory differs.
    for j in range(NUM_ENVS):
        assert not np.array_equal(obs_a[:, j], obs_c[:, j])


def test_cartpole_vector_seeding_reproduces():
    cfg = EnvCfg(id=CARTPOLE)
    obs_a, rew_a, term_a, _ = _vector_rollout(cfg, [5, 6], 50, 2)
    obs_b, rew_b, term_b, _ = _vector_rollout(cfg, [5, 6], 50, 2)
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rew_a, rew_b)
    np.testing.assert_array_equal(term_a, term_b)
    obs_c, _, _, _ = _vector_rollout(cfg, [7, 8], 50, 2)
    for j in range(NUM_ENVS):
        assert not np.array_equal(obs_a[0, j], obs_c[0, j])  # initial states differ
    # The two sub-envs of one vector env get their own seeds, so they differ too.
    assert not np.array_equal(obs_a[0, 0], obs_a[0, 1])


@pytest.mark.parametrize("env_id,num_actions", [(PONG, 6), (CARTPOLE, 2)])
def test_make_env_seed_reproduces(env_id, num_actions):
    cfg = EnvCfg(id=env_id, noop_max=30)
    obs_a, rew_a = _single_rollout(cfg, 3, 50, num_actions)
    obs_b, rew_b = _single_rollout(cfg, 3, 50, num_actions)
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rew_a, rew_b)
    obs_c, _ = _single_rollout(cfg, 4, 50, num_actions)
    assert obs_a.shape != obs_c.shape or not np.array_equal(obs_a, obs_c)


def test_derive_seeds():
    a = derive_seeds(0, 16)
    assert a == derive_seeds(0, 16)
    assert len(a) == 16 and len(set(a)) == 16
    assert all(isinstance(s, int) and 0 <= s < 2**31 for s in a)
    # Other salts and nearby run seeds give disjoint seed sets.
    assert set(a).isdisjoint(derive_seeds(0, 16, salt=1))
    assert set(a).isdisjoint(derive_seeds(1, 16))
    assert derive_seeds(1, 16, salt=3) != derive_seeds(1, 16, salt=4)


# --------------------------------------------------------------------------- id validation


@pytest.mark.parametrize(
    "bad_id,suggestion",
    [("ALE/Pongg-v5", "ALE/Pong-v5"), ("Pongg", "ALE/Pong-v5"), ("CartPol-v1", "CartPole-v1")],
)
def test_unknown_env_id(bad_id, suggestion):
    with pytest.raises(ValueError) as info:
        validate_env_id(bad_id)
    msg = str(info.value)
    assert "env.id" in msg
    assert repr(bad_id) in msg
    assert "CartPole-v1" in msg and "Pong" in msg and "Breakout" in msg  # lists valid ids
    hint = msg.split("Did you mean", 1)
    assert len(hint) == 2, msg
    assert suggestion in hint[1].split("\n", 1)[0]


def test_unknown_env_id_fails_in_every_factory():
    cfg = EnvCfg(id="ALE/Pongg-v5")
    for fn in (make_env, env_spec, lambda c: make_vector_env(c, 1)):
        with pytest.raises(ValueError, match="env.id"):
            fn(cfg)


def test_known_ids_validate():
    assert validate_env_id(PONG) == "atari"
    assert validate_env_id(CARTPOLE) == "classic"


# --------------------------------------------------------------------------- NEXT_STEP autoreset


def test_cartpole_next_step_autoreset_on_truncation():
    seeds = [5, 6]
    num_envs = len(seeds)
    vec = make_vector_env(EnvCfg(id=CARTPOLE, max_episode_steps=5), num_envs)
    # Reference: the same envs without the 5-step limit, seeded the same way.
    refs = [make_env(EnvCfg(id=CARTPOLE)) for _ in seeds]
    try:
        obs, _ = reset_vector_env(vec, seeds)
        ref_obs = np.stack([r.reset(seed=s)[0] for r, s in zip(refs, seeds, strict=True)])
        np.testing.assert_array_equal(obs, ref_obs)
        for t in range(5):
            act = _actions(t, num_envs, 2)
            obs, rew, term, trunc, _ = vec.step(act)
            ref_steps = [r.step(int(a)) for r, a in zip(refs, act, strict=True)]
            assert not term.any() and not any(s[2] or s[3] for s in ref_steps)
            np.testing.assert_array_equal(rew, 1.0)
            if t < 4:
                assert not trunc.any()
        assert trunc.all()
        # The truncating step returns the episode's true final observation...
        np.testing.assert_array_equal(obs, np.stack([s[0] for s in ref_steps]))
        # ...and the next step is the reset step: reward 0, no flags, the next episode's
        # first observation (which the reference gets from an unseeded reset).
        obs, rew, term, trunc, _ = vec.step(_actions(5, num_envs, 2))
        np.testing.assert_array_equal(rew, 0.0)
        assert not term.any() and not trunc.any()
        np.testing.assert_array_equal(obs, np.stack([r.reset()[0] for r in refs]))
        # Then a normal episode continues.
        _, rew, term, trunc, _ = vec.step(_actions(6, num_envs, 2))
        np.testing.assert_array_equal(rew, 1.0)
        assert not term.any() and not trunc.any()
    finally:
        vec.close()
        for r in refs:
            r.close()


def test_cartpole_reset_step_ignores_action():
    cfg = EnvCfg(id=CARTPOLE, max_episode_steps=3)
    outs = []
    for reset_action in (0, 1):
        env = make_vector_env(cfg, 1)
        try:
            reset_vector_env(env, [9])
            for _ in range(3):
                env.step(np.zeros(1, dtype=np.int64))
            env.step(np.full(1, reset_action, dtype=np.int64))  # the reset step
            outs.append(env.step(np.zeros(1, dtype=np.int64))[0])
        finally:
            env.close()
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("backend", ["ale", "gymnasium"])
def test_pong_next_step_autoreset_on_truncation(backend):
    # noop_max=0 makes resets deterministic, so the reset step can be compared exactly.
    steps = 60
    cfg = EnvCfg(id=PONG, vector_backend=backend, noop_max=0, max_episode_frames=200)
    ref_cfg = EnvCfg(id=PONG, vector_backend=backend, noop_max=0)
    obs, rew, term, trunc = _vector_rollout(cfg, [1, 2], steps, 6)
    ref_obs, _, _, ref_trunc = _vector_rollout(ref_cfg, [1, 2], steps, 6)
    assert not ref_trunc.any() and not term.any()
    assert trunc.any(), "200 emulator frames should truncate within 60 agent steps"
    for j in range(NUM_ENVS):
        t = int(np.argmax(trunc[:, j]))  # first truncating step (obs index t + 1)
        assert 45 <= t + 1 <= 55  # 200 frames / frame_skip 4 = ~50 agent steps
        final = obs[t + 1, j]
        # The truncating step returns the episode's real final observation, not a reset one:
        # the stack continues the previous observation and matches the untruncated run.
        np.testing.assert_array_equal(final[:-1], obs[t, j, 1:])
        np.testing.assert_array_equal(final[:-1], ref_obs[t + 1, j, :-1])
        assert not np.array_equal(final, obs[0, j])
        # Its newest frame can differ slightly from the reference: both ale-py and gymnasium's
        # AtariPreprocessing stop the frame-skip loop on truncation before grabbing the last
        # frame for the max-pool. It must still be that frame, not a reset screen.
        assert np.count_nonzero(final[-1] != ref_obs[t + 1, j, -1]) < 0.01 * final[-1].size
        # The following step is the reset step: reward 0, flags False, a first observation.
        assert rew[t + 1, j] == 0.0
        assert not term[t + 1, j] and not trunc[t + 1, j]
        np.testing.assert_array_equal(obs[t + 2, j], obs[0, j])


# --------------------------------------------------------------------------- lives, FIRE, parity


def _breakout_noop_game(cfg: EnvCfg, steps: int = 130) -> dict[str, np.ndarray]:
    """One Breakout env stepped with NOOP only, per step (index 0 = the reset)."""
    env = make_vector_env(cfg, 1)
    try:
        obs, info = reset_vector_env(env, [1])
        rec = {"obs": [obs[0]], "reward": [0.0], "term": [False], "trunc": [False]}
        rec |= {"lives": [info["lives"][0]], "frame": [info["episode_frame_number"][0]]}
        rec["life_loss"] = [False]
        for _ in range(steps):
            obs, rew, term, trunc, info = env.step(np.zeros(1, dtype=np.int64))
            for key, value in (
                ("obs", obs),
                ("reward", rew),
                ("term", term),
                ("trunc", trunc),
                ("lives", info["lives"]),
                ("frame", info["episode_frame_number"]),
                ("life_loss", info["life_loss"]),
            ):
                rec[key].append(value[0])
    finally:
        env.close()
    return {k: np.asarray(v) for k, v in rec.items()}


@pytest.mark.parametrize("backend", ["ale", "gymnasium"])
def test_breakout_episodic_life_ends_training_episodes_not_the_game(backend):
    # NOOP only: only the FIRE pressed on reset and after each life loss launches the ball.
    cfg = EnvCfg(id=BREAKOUT, vector_backend=backend, episodic_life=True, noop_max=0)
    g = _breakout_noop_game(cfg)
    over = int(np.flatnonzero(g["term"] & (g["lives"] == 0))[0])  # the game-over step
    lives = g["lives"][: over + 1]
    assert lives[0] == 5 and lives[-1] == 0
    assert np.all(np.diff(lives) <= 0), "lives only go down within a game"
    # Every life loss reaches the learner as a termination, and nothing else does.
    drops = np.flatnonzero(np.diff(lives) < 0) + 1
    np.testing.assert_array_equal(np.flatnonzero(g["term"][: over + 1]), drops)
    assert g["lives"][drops].tolist() == [4, 3, 2, 1, 0]
    assert g["life_loss"][drops].tolist() == [True] * 4 + [False]  # the last one is game over
    assert not g["trunc"].any()
    # The emulator is never reset in between: frames count on, the next step continues the
    # frame stack, and the game's first observation does not come back.
    assert np.all(np.diff(g["frame"][: over + 1]) > 0)
    for t in drops[:-1]:
        np.testing.assert_array_equal(g["obs"][t + 1][:-1], g["obs"][t][1:])
        assert g["frame"][t + 1] == g["frame"][t] + cfg.frame_skip
        assert not np.array_equal(g["obs"][t + 1], g["obs"][0])
    # Game over: the next step is the reset (reward 0, lives back to 5, frame 1).
    assert g["lives"][over + 1] == 5 and g["frame"][over + 1] == 1
    assert g["reward"][over + 1] == 0 and not g["term"][over + 1]
    np.testing.assert_array_equal(g["obs"][over + 1], g["obs"][0])


@pytest.mark.parametrize("backend", ["ale", "gymnasium"])
def test_breakout_full_games_and_no_forced_fire_without_episodic_life(backend):
    episodic = EnvCfg(id=BREAKOUT, vector_backend=backend, episodic_life=True, noop_max=0)
    # Evaluation of an episodic-life policy: life losses are flagged but end no episode, and
    # the FIRE after each life loss stays, so the NOOP game still ends (same steps as above).
    env = make_vector_env(episodic, 1, full_games=True)
    try:
        reset_vector_env(env, [1])
        terms, losses, lives = [], [], []
        for _ in range(130):
            _, _, term, _, info = env.step(np.zeros(1, dtype=np.int64))
            terms.append(term[0])
            losses.append(info["life_loss"][0])
            lives.append(info["lives"][0])
    finally:
        env.close()
    ref = _breakout_noop_game(episodic)
    over = int(np.flatnonzero(terms)[0])
    assert np.flatnonzero(terms).tolist() == [over] and lives[over] == 0  # game over only
    np.testing.assert_array_equal(losses, ref["life_loss"][1:])
    np.testing.assert_array_equal(lives, ref["lives"][1:])
    # Without episodic life, life losses are plain steps and the agent must press FIRE
    # itself: with NOOP only the ball never comes back after the first life.
    g = _breakout_noop_game(EnvCfg(id=BREAKOUT, vector_backend=backend, noop_max=0), 150)
    assert not g["term"].any() and g["life_loss"].sum() == 1
    assert g["lives"][-1] == 4


@pytest.mark.parametrize("fire_reset", [True, False])
@pytest.mark.parametrize("env_id,episodic_life", [(PONG, False), (BREAKOUT, True)])
def test_ale_and_gymnasium_backends_play_the_same_game(env_id, episodic_life, fire_reset):
    # noop_max=0 takes the no-op RNGs (which differ) out: everything else must match exactly:
    # FIRE on reset and after a life loss, zero padding, max-pool, resize, lives, rewards.
    # (Breakout: the fixed actions lose 4 and 2 lives and score in these 130 steps.)
    base = EnvCfg(id=env_id, noop_max=0, episodic_life=episodic_life, fire_reset=fire_reset)
    num_actions = 4 if env_id == BREAKOUT else 6
    ale, gym_ = (
        _vector_rollout(replace(base, vector_backend=backend), [4, 5], 130, num_actions)
        for backend in ("ale", "gymnasium")
    )
    for a, b in zip(ale, gym_, strict=True):
        np.testing.assert_array_equal(a, b)


def test_fire_reset_presses_fire():
    frames = {}
    for fire in (True, False):
        g = _breakout_noop_game(EnvCfg(id=BREAKOUT, noop_max=0, fire_reset=fire), 40)
        frames[fire] = g["frame"][0]
        # Without FIRE the ball is never launched: no life is lost by doing nothing.
        assert (g["lives"][-1] < 5) == fire
    assert frames == {True: 1, False: 0}


# --------------------------------------------------------------------------- ROM names


def test_ale_game_name():
    assert ale_game_name("ALE/MontezumaRevenge-v5") == "montezuma_revenge"
    assert ale_game_name("ALE/Pong-v5") == "pong"
    assert ale_game_name("ALE/MsPacman-v5") == "ms_pacman"
    assert ale_game_name("PongNoFrameskip-v4") == "pong"


def test_ale_game_name_is_a_rom_for_every_game():
    from ale_py import roms

    missing = [i for i in atari_ids() if roms.get_rom_path(ale_game_name(i)) is None]
    assert missing == []
    assert ale_game_name("ALE/TicTacToe3D-v5") == "tic_tac_toe_3d"


# --------------------------------------------------------------------------- optional extras


def _needs(module: str, extra: str):
    return pytest.importorskip(
        module, reason=f'needs the {extra} extra: pip install -e ".[{extra}]"'
    )


def test_lunarlander_through_the_box2d_extra():
    _needs("Box2D", "box2d")
    spec = env_spec(EnvCfg(id="LunarLander-v3"))
    assert (spec.kind, spec.obs_shape, spec.num_actions) == ("classic", (8,), 4)
    env = make_vector_env(EnvCfg(id="LunarLander-v3"), 2)
    try:
        obs, _ = reset_vector_env(env, [1, 2])
        assert obs.shape == (2, 8) and obs.dtype == np.float32
    finally:
        env.close()


def test_minatar_breakout_is_a_channels_first_float_grid():
    _needs("minatar", "minatar")
    spec = env_spec(EnvCfg(id="MinAtar/Breakout-v1"))
    assert (spec.kind, spec.obs_shape, spec.obs_dtype, spec.num_actions) == (
        "minatar",
        (4, 10, 10),
        np.float32,
        3,
    )
    env = make_vector_env(EnvCfg(id="MinAtar/Breakout-v1"), 2)
    try:
        obs, _ = reset_vector_env(env, [1, 2])
        assert obs.shape == (2, 4, 10, 10) and set(np.unique(obs)) <= {0.0, 1.0}
        assert obs.sum() > 0  # the paddle and the bricks are on the grid
        for _ in range(3):
            obs, reward, *_ = env.step(np.array([0, 2]))
        assert obs.shape == (2, 4, 10, 10)
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id, module, extra",
    [("LunarLander-v3", "Box2D", "box2d"), ("MinAtar/Breakout-v1", "minatar", "minatar")],
)
def test_a_missing_extra_names_the_install_line(monkeypatch, env_id, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ModuleNotFoundError, match=rf'pip install -e "\.\[{extra}\]"'):
        validate_env_id(env_id)
