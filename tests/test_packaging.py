"""What a user installs works away from the checkout: a built wheel carries Hydra's config
tree (conf/, shipped as impala_gpu/conf) and ``python -m impala_gpu`` / ``impala-gpu`` find it
from any folder; an editable install of a checkout finds the checkout's conf/.

Both builds run on a copy of the files a build reads, so the checkout gets no build/ or
egg-info, and a stale build/ cannot put old files in the wheel. The runtime dependencies come
from this interpreter's site-packages; the installed copy must be the one imported (asserted),
never the checkout's package."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
# What `pip wheel .` reads: the metadata, the readme it embeds, the package and conf/.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "impala_gpu", "conf")
# The checkout's folders that must stay out of the wheel, copied too so a build could pick
# them up: the benchmarks (developer tools), the shell scripts and the archive of runs.
LEFT_OUT = ("benchmarks", "scripts", "results")
# The console scripts beside impala-gpu: the two reports run most often.
REPORT_SCRIPTS = {"impala-gpu-plot": "--out", "impala-gpu-summary": "--thresholds"}
GROUPS = ("algo", "compare_cell", "env", "experiment", "lag_cell", "model", "recipe")
# Compositions that read every group (env, model, algo, experiment, both cells) from the tree.
COMPOSED = {
    "experiment=pong_impala": ("  id: ALE/Pong-v5",),
    "env=cartpole model=mlp algo=a3c": ("  id: CartPole-v1", "  name: a3c"),
    "experiment=compare_cartpole compare_cell=a3c_160": ("  name: a3c", "envs_per_actor: 8"),
    "experiment=lag_study lag_cell=L8": ("  id: LunarLander-v3", "bounded_lag: 8"),
}

pytestmark = pytest.mark.slow
# The builds run without isolation (no index needed): the build backend comes from this env.
pytest.importorskip("setuptools", reason="the dev extra brings it: pip install -e '.[dev]'")


def _copy_sources(dst: Path) -> Path:
    dst.mkdir()
    for name in (*BUILD_INPUTS, *LEFT_OUT):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst / name)
    return dst


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(extra)
    return env


def _yaml_names() -> set[str]:
    return {p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml")}


# One process composes every entry of COMPOSED with Hydra's compose API, from the CONF_DIR the
# package found: each process pays a few seconds of imports, which a loaded box stretches.
COMPOSE_ALL = """
import sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
import impala_gpu.cli as c
print(c.__file__, c.CONF_DIR)
with initialize_config_dir(config_dir=c.CONF_DIR, version_base="1.3"):
    for overrides in sys.argv[1:]:
        print("=== " + overrides)
        print(OmegaConf.to_yaml(compose("config", overrides=overrides.split())))
"""


def _check_runs(python: str, script: str, cwd: Path, env: dict[str, str], conf: Path) -> None:
    """The package imported is ``conf``'s and its config tree is ``conf``; every group composes
    from there; ``python -m impala_gpu`` runs, and the console script lists every option."""
    out = _run([python, "-c", COMPOSE_ALL, *COMPOSED], cwd, env)
    module, conf_dir = out.splitlines()[0].split()
    assert Path(conf_dir) == conf.resolve(), (module, conf_dir)
    assert Path(module).resolve().is_relative_to(conf.resolve().parent), module
    assert not Path(module).resolve().is_relative_to(REPO), module
    composed = dict(part.split("\n", 1) for part in out.split("=== ")[1:])
    for overrides, expected in COMPOSED.items():
        assert set(expected) <= set(composed[overrides].splitlines()), (overrides, out[:2000])
    job = _run([python, "-m", "impala_gpu", "--cfg", "job", "experiment=pong_impala"], cwd, env)
    assert "  id: ALE/Pong-v5" in job.splitlines(), job[:2000]
    # The console script's --help lists each group's options, as Hydra found them on disk.
    help_text = _run([script, "--help"], cwd, env)
    listed = _help_groups(help_text)
    assert set(GROUPS) <= set(listed), help_text
    for name in _yaml_names() - {"config.yaml"}:
        group, option = name.removesuffix(".yaml").split("/")
        assert option in listed[group], (name, help_text)


def _help_groups(help_text: str) -> dict[str, list[str]]:
    """``--help``'s config groups: a line per group, then its options, indented further."""
    section = help_text.split("Config groups")[1].split("Frequent keys")[0]
    listed: dict[str, list[str]] = {}
    group = None
    for line in section.splitlines()[1:]:
        if line.startswith("  ") and not line.startswith("   "):
            group = line.split()[0]
            listed[group] = []
        elif group is not None and line.strip():
            listed[group] += [o.strip().removesuffix(" (chosen)") for o in line.split(",")]
    return {g: [o for o in options if o] for g, options in listed.items()}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(tmp / "src")
    _run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp / "dist")],
        tmp, _clean_env(),
    )  # fmt: skip
    (path,) = (tmp / "dist").glob("impala_gpu-*.whl")
    return path


def test_the_wheel_carries_every_config(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = {n for n in _yaml_names() if f"impala_gpu/conf/{n}" not in names}
    assert not missing, missing
    assert "impala_gpu/__main__.py" in names and "impala_gpu/algos/impala.py" in names


def test_the_wheel_carries_the_reports_and_nothing_beside_the_package(wheel: Path) -> None:
    zf = zipfile.ZipFile(wheel)
    names = set(zf.namelist())
    reports = {p.name for p in (REPO / "impala_gpu" / "reports").glob("*.py")}
    assert {f"impala_gpu/reports/{n}" for n in reports} <= names, sorted(names)
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"impala_gpu"}, tops
    (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
    listed = zf.read(entry_points).decode()
    assert all(f"{script} = " in listed for script in REPORT_SCRIPTS), listed


def test_an_installed_wheel_runs_from_any_folder(wheel: Path, tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    _run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site_dir),
         str(wheel)],
        tmp_path, _clean_env(),
    )  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # PYTHONPATH's entries come before site-packages, and an editable install's finder (if
    # the checkout is installed that way) is consulted only after them: the wheel's copy wins.
    env = _clean_env(PYTHONPATH=str(site_dir))
    script = str(site_dir / "bin" / "impala-gpu")
    _check_runs(sys.executable, script, elsewhere, env, site_dir / "impala_gpu" / "conf")
    for name, flag in REPORT_SCRIPTS.items():
        assert flag in _run([str(site_dir / "bin" / name), "--help"], elsewhere, env), name


def test_an_editable_install_uses_the_checkouts_conf(tmp_path: Path) -> None:
    """A fresh venv, with this interpreter's site-packages (the dependencies) on its path via a
    .pth line (which, unlike a site dir, runs none of that dir's .pth files, so any editable
    install there stays out), and ``pip install -e`` of a copy of the checkout."""
    src = _copy_sources(tmp_path / "checkout")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, _clean_env())
    py = venv / "bin" / "python"
    own = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               tmp_path, _clean_env()).strip()  # fmt: skip
    deps = [
        p for p in dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]]) if p
    ]
    Path(own, "deps.pth").write_text("\n".join(deps) + "\n")
    _run(
        [str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "-e",
         str(src)],
        tmp_path, _clean_env(),
    )  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _check_runs(str(py), str(venv / "bin" / "impala-gpu"), elsewhere, _clean_env(), src / "conf")
