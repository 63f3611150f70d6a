"""``python -m impala_gpu --help``: the frequent keys with their values and one-line docs, and
the config groups a user picks from (not the schema's ``base_*`` entries, which are internal).

Hydra's help is a template (``hydra.help.template`` in ``conf/config.yaml``); its
``${impala_gpu.help_groups:}`` and ``${impala_gpu.help_keys:}`` are the resolvers below, so
the text is made from ``conf/`` and ``impala_gpu/config/schema.py`` each time and cannot drift from
them. They read the composed config, so ``--help env=cartpole`` shows CartPole's values.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import textwrap
from typing import Any

from omegaconf import DictConfig, OmegaConf

from impala_gpu import config as config_module

# What a new user sets most, in the order they meet it.
FREQUENT = (
    "env.id",
    "total_frames",
    "target_return",
    "max_seconds",
    "num_actors",
    "envs_per_actor",
    "unroll_length",
    "batch_size",
    "algo.learning_rate",
    "algo.entropy_cost",
    "model.name",
    "model.use_lstm",
    "device",
    "precision",
    "seed",
    "run_dir",
    "resume",
    "checkpoint.every_minutes",
    "wandb.mode",
    "progress",
    "log_interval_s",
)
GROUP_DOCS = {
    "env": "the game or task and its family's recipe (env.id=ALE/<Game>-v5: any game)",
    "recipe": "set by env: the family's model, sizes, optimizer and stop target",
    "model": "the network (auto: by observation)",
    "algo": "the algorithm",
    "experiment": "presets for studies and comparisons; a preset pins its own recipe",
    "compare_cell": "the cells of the compare_* sweeps (their presets pick them)",
    "lag_cell": "the cells of the lag_* sweeps (their presets pick them)",
}
INTERNAL = "base_"  # the schema's own entries (config.register_configs): not user options


@functools.cache
def field_docs() -> dict[str, str]:
    """Each schema key's one-line doc: its field's end-of-line comment in config/schema.py."""
    docs: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        comments = dict(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.*)$", inspect.getsource(cls), re.M))
        for f in dataclasses.fields(cls):
            factory = f.default_factory
            if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory):
                walk(factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
            elif f.name in comments:
                docs[prefix + f.name] = comments[f.name]

    walk(config_module.Config, "")
    return docs


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _escape(text: str) -> str:
    """Hydra fills the template with string.Template, where ``$`` starts a placeholder."""
    return text.replace("$", "$$")


def help_keys(_root_: DictConfig) -> str:
    """The frequent keys, ``key=value`` as this command composes them, and their docs."""
    docs = field_docs()
    rows = []
    for key in FREQUENT:
        try:
            value = _shown(OmegaConf.select(_root_, key, throw_on_missing=False))
        except Exception:  # an interpolation help cannot resolve: show it as written
            value = "?"
        rows.append((f"{key}={value}", docs.get(key, "")))
    width = min(36, max(len(k) for k, _ in rows))
    return _escape("\n".join(f"  {k:<{width}}  {doc}" for k, doc in rows))


def help_groups(_root_: DictConfig) -> str:
    """Each group: what it picks, its options, and the one this command chose."""
    from impala_gpu.overrides import config_groups

    choices = OmegaConf.select(_root_, "hydra.runtime.choices", default=None) or {}
    lines = []
    for group, options in sorted(config_groups().items(), key=lambda g: _group_order(g[0])):
        shown = [o for o in options if not o.startswith(INTERNAL)]
        if not shown:
            continue
        chosen = choices.get(group)
        names = ", ".join(f"{o} (chosen)" if o == chosen else o for o in shown)
        lines.append(f"  {group:<13}{GROUP_DOCS.get(group, '')}")
        lines += textwrap.wrap(names, 90, initial_indent=" " * 17, subsequent_indent=" " * 17)
    return _escape("\n".join(lines))


def _group_order(group: str) -> tuple[int, str]:
    order = list(GROUP_DOCS)
    return (order.index(group) if group in order else len(order), group)


def register_help_resolvers() -> None:
    """The template's resolvers (idempotent)."""
    OmegaConf.register_new_resolver("impala_gpu.help_keys", help_keys, replace=True)
    OmegaConf.register_new_resolver("impala_gpu.help_groups", help_groups, replace=True)
