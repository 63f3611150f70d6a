"""A run dir belongs to one run.

Two runs writing into one dir interleave their metrics and TensorBoard files and replace each
other's checkpoints (``best.pt`` of a long run by a short one's). So a run claims its dir
(``claim_run_dir``) before anything is written there, and holds the claim for its life:

- **In use**: the claim is an exclusive ``flock`` on the dir itself, held open by the run's
  process. The kernel drops it when that process ends, however it ends (a SIGKILLed run leaves
  no stale lock), and it adds no file to the dir. A second run into a locked dir is refused
  with the holder's pid.
- **Holds a run**: a new run refuses a dir holding anything but Hydra's own files (``.hydra/``
  and the job's log): metrics, checkpoints, weights, events of a finished or killed run. Only a
  resume of that run writes there (``resume=<dir>``); the message says so, or, with no
  checkpoint to resume, to pick another ``run_dir=``.

Refusing, not choosing a fresh dir, when the user named the dir: scripts and notebooks read
``<run_dir>/metrics.jsonl`` right after the run, and a run that quietly wrote elsewhere would
have them read the other run's files. A dir the user did not name (the dated default under
``runs/``, shared by two runs started within the same second) gets a fresh name instead
(``..._2``), and the console says so.

``ClaimRunDir``, a Hydra callback (``conf/config.yaml``), claims the dir before Hydra makes it
and writes ``.hydra/`` there; for ``resume=`` it points Hydra's output dir at the resumed run's
own, so a resume makes no new dir, and puts that attempt's Hydra files in
``.hydra/resume-<k>/`` beside the first command's.
"""

from __future__ import annotations

import fcntl
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from impala_gpu.config import ConfigError
from impala_gpu.reporting.checkpoint import BEST, CKPT_DIR, list_checkpoints

HYDRA_SUBDIR = ".hydra"


class RunDirInUse(ConfigError):
    """The run dir is locked by another live process."""


class RunDirTaken(ConfigError):
    """The run dir holds another run's files and this is no resume of that run."""


@dataclass
class Claim:
    """This process's lock on one run dir (``release`` ends it; process exit does too)."""

    path: Path
    fd: int

    def release(self) -> None:
        if _HELD.get(self.path) is self:
            del _HELD[self.path]
            os.close(self.fd)  # closing the only descriptor drops the flock


_HELD: dict[Path, Claim] = {}  # by real path: a second open of the dir would lock against us


def run_files(path: Path, job_name: str = "cli") -> list[str]:
    """What ``path`` holds besides Hydra's own files: the traces of a run."""
    if not path.is_dir():
        return []
    hydra = {HYDRA_SUBDIR, f"{job_name}.log"}
    found = [p.name + ("/" if p.is_dir() else "") for p in path.iterdir() if p.name not in hydra]
    # What a user knows a run by first: its metrics, checkpoints and weights.
    first = ("metrics.jsonl", f"{CKPT_DIR}/", "model.pt")
    return sorted(found, key=lambda name: (first.index(name) if name in first else 3, name))


def holder_pid(path: Path) -> int | None:
    """The pid holding an flock on ``path`` (``/proc/locks``), or None if unknown."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF" ("->" marks a waiter)
        if "FLOCK" in fields and "->" not in fields and dev in fields:
            return int(fields[fields.index(dev) - 1])
    return None


def _lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def in_use_text(path: Path) -> str:
    pid = holder_pid(path)
    return f"in use by another run ({f'pid {pid}' if pid else 'it holds the dir lock'})"


def claim_run_dir(
    path: str | Path,
    *,
    resuming: Path | None = None,
    check_files: bool = True,
    job_name: str = "cli",
) -> Claim:
    """Lock ``path`` (made if missing) for this run, or raise ``RunDirInUse``. With
    ``check_files``, a dir holding another run's files is ``RunDirTaken`` unless ``resuming``
    (the run dir being resumed) is that dir. A dir this process holds already is returned as
    is: the callback claimed it before Hydra wrote its files."""
    path = Path(path).absolute()
    held = _HELD.get(Path(os.path.realpath(path)))
    if held is not None:
        return held
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"run_dir={path} cannot be created ({e.strerror}). Fix: a writable run_dir=."
        ) from e
    fd = _lock(path)
    if fd is None:
        raise RunDirInUse(
            f"run_dir={path} is {in_use_text(path)}: two runs in one dir would interleave "
            "their metrics and overwrite each other's checkpoints. Fix: another run_dir=, or "
            "wait until that run ends."
        )
    claim = Claim(Path(os.path.realpath(path)), fd)
    _HELD[claim.path] = claim
    own = resuming is not None and Path(os.path.realpath(resuming)) == claim.path
    found = run_files(path, job_name) if check_files and not own else []
    if found:
        claim.release()
        raise RunDirTaken(taken_text(path, found, resuming))
    return claim


def taken_text(path: Path, found: list[str], resuming: Path | None) -> str:
    shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
    what = f"resuming {resuming} into run_dir={path}" if resuming else f"run_dir={path}"
    if resumable(path):
        fix = f"Fix: resume={path} to continue that run, or another run_dir=."
    else:
        fix = "Fix: another run_dir= (it holds no checkpoint to resume), or remove that dir."
    return (
        f"{what}: the dir already holds another run's files ({shown}), which a new run would "
        f"overwrite. {fix}"
    )


def resumable(path: Path) -> bool:
    return bool(list_checkpoints(path)) or (path / CKPT_DIR / BEST).is_file()


def resumed_run_dir(resume: str) -> Path | None:
    """The run dir ``resume=`` continues (as ``cli.resume_config`` derives it), or None when
    it names nothing to resume: ``cli.run`` then reports that."""
    p = Path(resume).absolute()
    if p.is_dir():
        return p if resumable(p) else None
    if p.is_file() and p.parent.name == CKPT_DIR:
        return p.parent.parent
    return None


def _torchrun_follower() -> bool:
    """A torchrun rank > 0: rank 0 owns the run dir (``learning.distributed``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK", "0") != "0"


def _set_hydra(config: DictConfig, key: str, value: str) -> None:
    with read_write(config.hydra), open_dict(config.hydra):
        OmegaConf.update(config, f"hydra.{key}", value, merge=False)


def _fresh_name(path: Path) -> Path:
    """``path`` itself, or ``path_2``, ``path_3``, ... : the first that holds no run and is not
    in use (a claim attempt, so two runs started at once get different names)."""
    for k in range(1, 1000):
        candidate = path if k == 1 else path.with_name(f"{path.name}_{k}")
        try:
            claim_run_dir(candidate)
            return candidate
        except (RunDirInUse, RunDirTaken):
            continue
    raise ConfigError(f"no free run dir next to {path}. Fix: run_dir=<a new dir>.")


def claim_for_hydra(config: DictConfig) -> None:
    """``ClaimRunDir``'s work: claim the dir Hydra is about to make (``hydra.run.dir``),
    redirecting it for a resume (the resumed run's dir) or a collision of default names."""
    if _torchrun_follower():
        return
    job = str(config.hydra.job.name)
    named = config.get("run_dir") or any(
        o.startswith("hydra.run.dir=") for o in config.hydra.overrides.hydra
    )
    resume = config.get("resume")
    own = resumed_run_dir(str(resume)) if resume else None
    if own is not None and not named:  # a resume writes into its own run: no new dir
        _set_hydra(config, "run.dir", str(own))
    HydraConfig.instance().set_config(config)  # hydra.run.dir may read ${hydra:...}
    path = Path(str(OmegaConf.select(config, "hydra.run.dir"))).absolute()
    if own is not None and os.path.realpath(own) == os.path.realpath(path):
        claim_run_dir(path, resuming=own, job_name=job)
        _set_hydra(config, "output_subdir", _resume_subdir(path))
    elif named:
        claim_run_dir(path, resuming=own, job_name=job)
    else:
        fresh = _fresh_name(path)
        if fresh != path:
            print(
                f"impala_gpu: {path} is {in_use_text(path)} or holds its files; this run "
                f"writes to {fresh}",
                file=sys.stderr,
                flush=True,
            )
            _set_hydra(config, "run.dir", str(fresh))


def _resume_subdir(run_dir: Path) -> str:
    """``.hydra/resume-<k>``: a resume's Hydra files, beside (not over) the first command's."""
    k = 1
    while (run_dir / HYDRA_SUBDIR / f"resume-{k}").exists():
        k += 1
    return f"{HYDRA_SUBDIR}/resume-{k}"


class ClaimRunDir(Callback):
    """Hydra callback (``conf/config.yaml``, after the config check): claim the run dir
    before Hydra makes it, or end the process with the one-line reason (a callback's
    exception would only be a warning to Hydra)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            claim_for_hydra(config)
        except ConfigError as e:
            sys.exit(f"impala_gpu: {type(e).__name__}: {e}")


def release_all() -> None:
    """Release every run dir this process holds (a run, or a sweep point, has ended)."""
    for claim in list(_HELD.values()):
        claim.release()
