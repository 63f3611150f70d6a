"""The command line's overrides, checked before Hydra composes them.

Hydra's own errors here are several lines without a fix, and one case was no error at all:
``+foo=1`` (the fix Hydra prints for ``foo=1``) composed, the config check only warned, and
Pong trained. Here every override's key must be in the schema (``impala_gpu/config/schema.py``)
or be a config group, its value must have the key's type, and a group's option must exist; a
typo gets "did you mean" (difflib over the schema's keys). Each failure is one ``ConfigError``.

Integers in scientific notation (``total_frames=1e7``, as users write them) are rewritten to
plain integers here, before Hydra sees them: the schema keeps ``int`` (so config.yaml, W&B and
every reader still see an integer), and no resolver or custom type has to be in every config.
"""

from __future__ import annotations

import difflib
import functools
import math
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode, StringNode, ValueNode

from impala_gpu.config import Config, ConfigError, conf_dir

HELP = "python -m impala_gpu --help lists the frequent keys; --cfg job prints every one"
TYPE_NAMES = {
    IntegerNode: "an integer",
    FloatNode: "a number",
    BooleanNode: "true or false",
    StringNode: "a string",
}


@functools.cache
def schema() -> DictConfig:
    """The structured schema every composed config must fit (read-only: checks copy it)."""
    cfg = OmegaConf.structured(Config)
    OmegaConf.set_readonly(cfg, True)
    return cfg


@functools.cache
def schema_keys() -> dict[str, Any]:
    """Every dotted key of the schema, groups' nodes (``algo``) and leaves (``algo.discount``)
    alike, to its node."""
    keys: dict[str, Any] = {}

    def walk(node: DictConfig, prefix: str) -> None:
        for name in node.keys():
            key = f"{prefix}{name}"
            child = node._get_node(name)
            keys[key] = child
            if isinstance(child, DictConfig):
                walk(child, f"{key}.")

    walk(schema(), "")
    return keys


def config_groups(extra_dirs: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Each config group (a folder of ``conf/``, of ``--config-dir``, or the ConfigStore's) and
    its options."""
    from hydra.core.config_store import ConfigStore

    groups: dict[str, set[str]] = {}
    for root in (conf_dir(), *extra_dirs):
        for folder in Path(root).iterdir():
            if folder.is_dir():
                names = {p.stem for p in folder.glob("*.yaml")}
                groups.setdefault(folder.name, set()).update(names)
    for name, entry in ConfigStore.instance().repo.items():
        if isinstance(entry, dict) and name != "hydra":
            groups.setdefault(name, set()).update(k.removesuffix(".yaml") for k in entry)
    return {g: sorted(opts) for g, opts in groups.items()}


def did_you_mean(key: str, candidates: list[str]) -> list[str]:
    """The candidates closest to ``key``; a key given without its group (``lerning_rate``) is
    matched on the candidates' last part too (``algo.learning_rate``)."""
    scores = {c: difflib.SequenceMatcher(None, key, c).ratio() for c in candidates}
    best = max(scores.values(), default=0.0)
    # Only the near-best: keys that share a group's prefix score high on it alone
    # ("algo.lerning_rate" against "algo.name"), and are no help.
    close = sorted((c for c, r in scores.items() if r >= max(0.6, best - 0.05)), key=scores.get)
    if close:
        return close[::-1][:3]
    by_leaf: dict[str, list[str]] = {}
    for c in candidates:
        by_leaf.setdefault(c.rsplit(".", 1)[-1], []).append(c)
    leaves = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(by_leaf), n=2, cutoff=0.75)
    return [c for leaf in leaves for c in by_leaf[leaf]][:3]


def _value_text(value: Any) -> str:
    return "null" if value is None else str(value)


def _check_value(key: str, node: Any, value: Any, given: str) -> Any:
    """``value`` as the schema's ``key`` takes it, or a ConfigError naming the type. A float
    with an integer value for an int key (``1e7``) comes back an int."""
    if isinstance(node, IntegerNode) and isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
    if isinstance(value, str) and "${" in value:
        return value  # an interpolation: OmegaConf resolves and checks it later
    if not isinstance(node, ValueNode) or isinstance(value, dict | list):
        return value  # a whole group's node, or a list: Hydra's merge checks it
    trial = OmegaConf.create({"v": node})
    try:
        trial.v = value
    except OmegaConfBaseException:
        kind = TYPE_NAMES.get(type(node), f"of type {type(node).__name__}")
        example = schema_value(key)
        if value is None:
            problem = f"{key} cannot be null: it must be {kind}"
        else:
            problem = f"{key}={given} is not {kind}"
            if isinstance(node, IntegerNode) and isinstance(value, float):
                problem += " (a whole number: 32, 1e7 or 10_000_000)"
        raise ConfigError(
            f"{problem}. Fix: {key}=<{kind.removeprefix('an ').removeprefix('a ')}>, e.g. "
            f"{key}={example} (its default). {HELP}."
        ) from None
    return value


def schema_value(key: str) -> str:
    """The schema's default of ``key``, as a command line writes it."""
    value = OmegaConf.select(schema(), key, throw_on_missing=False)
    if isinstance(value, bool):
        return str(value).lower()
    return _value_text(value)


def _unknown_key(text: str, key: str, groups: dict[str, list[str]]) -> ConfigError:
    keys = [k for k, n in schema_keys().items() if not isinstance(n, DictConfig)]
    close = did_you_mean(key, keys + list(groups))
    value = text.split("=", 1)[1] if "=" in text else ""
    if close:
        fix = f"Did you mean {' or '.join(close)}? Fix: {close[0]}={value}" if value else ""
        fix = fix or f"Did you mean {' or '.join(close)}? Fix: ~{close[0]}"
    else:
        fix = f"Fix: remove {text}; {HELP}"
    added = text.lstrip("~").startswith("+")
    why = " (+ adds a key the schema does not have; nothing would read it)" if added else ""
    return ConfigError(f"{text}: {key} is not a config key{why}. {fix}.")


@functools.cache
def default_groups() -> frozenset[str]:
    """The groups ``conf/config.yaml``'s defaults list already picks (``env``, ...): ``+`` on
    one of them is Hydra's "Multiple values for experiment"."""
    defaults = OmegaConf.load(Path(conf_dir()) / "config.yaml").get("defaults") or []
    return frozenset(k for d in defaults if isinstance(d, DictConfig) for k in d.keys())


def _check_group(
    o: Override, text: str, groups: dict[str, list[str]], deleted: frozenset[str]
) -> None:
    """A group's option exists (``env=cartpol`` gets "did you mean env=cartpole")."""
    options = groups[o.key_or_group]
    value = o.value()
    chosen_by_defaults = o.key_or_group in default_groups() - deleted
    if o.type == OverrideType.ADD and chosen_by_defaults:
        raise ConfigError(
            f"{text}: {o.key_or_group} is already chosen by the defaults; + adds a group that "
            f"is not. Fix: {text[1:]} (without the +)."
        )
    if o.is_delete() or value is None or o.package is not None:
        return
    chosen = value.list if isinstance(value, ChoiceSweep) else [value]
    for v in chosen:
        if not isinstance(v, str) or "*" in v or v in options:
            continue
        shown = [x for x in options if not x.startswith("base_")]
        close = difflib.get_close_matches(v, shown, n=1, cutoff=0.5)
        group = o.key_or_group
        hint = f" Did you mean {group}={close[0]}?" if close else ""
        fix = f"{group}={close[0]}; its options: " if close else f"{group}= one of "
        raise ConfigError(
            f"{text}: {group} has no option {v!r}.{hint} Fix: {fix}{', '.join(shown)}."
        )


def _rewrite(o: Override, values: list[Any], explicit: bool = False) -> str:
    """The override with ``values``: one, a choice sweep's ``a,b``, or ``choice(a,b)``."""
    texts = ",".join(Override._get_value_element_as_str(v) for v in values)
    return f"{o.get_key_element()}={f'choice({texts})' if explicit else texts}"


def check_override(
    text: str, groups: dict[str, list[str]], deleted: frozenset[str] = frozenset()
) -> str:
    """One override, checked; returned as given, or rewritten (``total_frames=10000000``)."""
    try:
        (o,) = OverridesParser.create().parse_overrides([text])
    except HydraException as e:
        first = str(e).splitlines()[0]
        raise ConfigError(
            f"{text!r} is not an override Hydra can parse ({first}). Fix: write key=value, "
            "e.g. batch_size=32, or quote a value with spaces: 'key=\"a b\"'."
        ) from None
    key = o.key_or_group
    if o.is_hydra_override() or key == "hydra":
        return text  # Hydra's own keys and groups: Hydra checks them
    if key in groups:
        _check_group(o, text, groups, deleted)
        return text
    node = schema_keys().get(key)
    if node is None:
        raise _unknown_key(text, key, groups)
    if o.type == OverrideType.ADD:
        raise ConfigError(
            f"{text}: {key} is already a config key; + adds a new one. Fix: {text[1:]} "
            "(without the +)."
        )
    if o.is_delete():
        return text
    value = o.value()
    if isinstance(value, ChoiceSweep):
        if value.shuffle or value.tags:  # an explicit choice(); Hydra types each point
            return text
        given = [Override._get_value_element_as_str(v) for v in value.list]
        checked = [_check_value(key, node, v, g) for v, g in zip(value.list, given, strict=True)]
        changed = any(a is not b for a, b in zip(checked, value.list, strict=True))
        return _rewrite(o, checked, explicit=not value.simple_form) if changed else text
    if o.is_sweep_override():
        return text  # range() and interval(): the sweeper types them
    given = text.split("=", 1)[1]
    checked = _check_value(key, node, value, given)
    return _rewrite(o, [checked]) if checked is not value else text


def check_overrides(overrides: list[str], config_dirs: tuple[str, ...] = ()) -> list[str]:
    """Every override checked (see the module's doc), in order; ints written as ``1e7``
    rewritten."""
    groups = config_groups(config_dirs)
    deleted = frozenset(t[1:].split("=", 1)[0] for t in overrides if t.startswith("~"))
    return [check_override(text, groups, deleted) for text in overrides]


def check_command_line(argv: list[str]) -> list[str]:
    """``argv`` (the command's arguments, without the program) with its overrides checked and
    rewritten, its flags as given. Parsed with Hydra's own parser, so flags and overrides are
    told apart as Hydra will."""
    from hydra._internal.utils import get_args_parser

    if "--version" in argv:  # argparse's version action would print and exit here
        return argv
    args = get_args_parser().parse_args(argv)
    if args.shell_completion:
        return argv
    dirs = (args.config_dir,) if args.config_dir else ()
    checked = check_overrides(list(args.overrides), dirs)
    rewrite = {a: b for a, b in zip(args.overrides, checked, strict=True) if a != b}
    return [rewrite.get(a, a) for a in argv]
