"""Where ``auto``'s timings and trial figures are kept: one JSON file per user, one entry per
machine (CPU, cores, GPU, library versions) and workload (env, model, algo and its SGD steps
per update, T, device), so a later run on the same machine and workload starts at once and no
other machine trusts them."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from impala_gpu.calibration.model import Candidate, timing_key

CACHE_ENV = "IMPALA_GPU_CACHE_DIR"  # where calibration.json goes (default ~/.cache/impala_gpu)
# The instruction sets that decide fp32 against bf16 on a CPU learner.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "impala_gpu"
    )
    return Path(root) / "calibration.json"


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's name, model number and speed-relevant flags, from ``/proc/cpuinfo`` text.

    Cloud VMs often report one name ("Intel(R) Xeon(R) Processor") for CPUs that differ in
    exactly what decides fp32 against bf16 (AVX-512 BF16, AMX), and so in which one ``auto``
    picks (docs/performance.md has two such machines). So the model number and those flags are
    part of the name, and of the cache's key.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        if key.strip() in fields:  # the first processor describes them all
            break
        fields[key.strip()] = value.strip()
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "model" not in fields:
        return name
    flags = set(fields.get("flags", "").split())
    has = " ".join(f for f in SPEED_FLAGS if f in flags) or "no avx2"
    return f"{name} (family {fields.get('cpu family', '?')} model {fields['model']}; {has})"


def machine_key(device: torch.device) -> dict[str, Any]:
    """What the timings depend on besides the workload: the hardware and library versions."""
    import gymnasium

    from impala_gpu import __version__
    from impala_gpu.speed.tcmalloc import allocator

    try:
        import ale_py

        ale = ale_py.__version__
    except ImportError:
        ale = None
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 1,
        "gpu": gpu,
        "torch": torch.__version__,
        "ale_py": ale,
        "gymnasium": gymnasium.__version__,
        "impala_gpu": __version__,
        "allocator": allocator(),
    }


def workload_key(cfg, device: torch.device) -> dict[str, Any]:
    e, m = cfg.env, cfg.model
    key = {
        "env": [e.id, e.frame_skip, e.frame_stack, e.screen_size, e.vector_backend],
        "model": [m.name, m.hidden_size, m.mlp_layers, m.use_lstm, m.lstm_size, m.channels_last],
        "algo": [cfg.algo.name, cfg.algo.optimizer],
        # an update is epochs x minibatches SGD steps: a 2 x 4 recipe's update time must not
        # stand in for a 1 x 1 one's (with this field, entries written before it miss once)
        "sgd": [cfg.algo.epochs, cfg.algo.minibatches],
        "T": cfg.unroll_length,
        "device": device.type,
        "compile": cfg.compile,
    }
    if cfg.learner_shards != 1:  # keeps the keys of caches written before the option
        key["learner_shards"] = cfg.learner_shards
    return key


def entry_key(cfg, device: torch.device) -> str:
    return json.dumps({**machine_key(device), **workload_key(cfg, device)}, sort_keys=True)


def trial_key(c: Candidate, cfg) -> str:
    """A trial's figure's key in its entry: the candidate and what else sets its speed."""
    parts = (c.precision, c.num_actors, c.envs_per_actor, cfg.batch_size, cfg.learner_threads)
    return timing_key(parts)


def load_cache(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or unreadable (a half-written file): measure again


def save_cache(path: Path, cache: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, path)  # atomic: parallel sweep jobs never read half a file


def cached_entry(cfg, device: torch.device) -> dict[str, Any]:
    """This machine's cached timings for ``cfg``'s workload (empty when none)."""
    entry = load_cache(cache_path()).get(entry_key(cfg, device))
    return entry or {"learner_step_s": {}, "policy_step_s": {}, "env_step_s": None}


def cached_trials(cfg, device: torch.device, cands: list[Candidate]) -> dict[Candidate, float]:
    """The end-to-end figures cached for those of ``cands`` that a trial ran (agent steps/s)."""
    ran = cached_entry(cfg, device).get("trial_steps_per_s", {})
    return {c: ran[trial_key(c, cfg)] for c in cands if trial_key(c, cfg) in ran}
