"""Composing ``conf/`` like ``run.py`` does: :func:`compose` (Hydra's compose API, Hydra's errors made one line
by :func:`explain_compose_error`, then :func:`harness.config.check.validate`).

Where the checks run:
    * ``run.py`` composes and validates every job of the command line (each value of a sweep too) before
      Hydra starts (:func:`harness.config.precheck.precheck`), and prints ``error: ...`` lines and exits 2;
    * :func:`harness.job.app.main_job` validates its config first, before task data is read and before any
      model is fetched or loaded (jobs swept by an experiment's ``hydra.sweeper.params``, Python callers);
    * :func:`compose` (the compose API plus the same translation and validation) serves tests and scripts.

The config package, by part: :mod:`harness.config.schemas` (the typed schemas, generated for the registered
decoders and tasks), :mod:`harness.config.errors` (how a problem is said), :mod:`harness.config.rules` (bounds
and the rules across fields), :mod:`harness.config.check` (:func:`validate`), :mod:`harness.config.tuned` (the
configs by name, the generated tuned configs), this module, and :mod:`harness.config.precheck` (the command
line). The names other modules import from here are re-exported below.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from declare import show
from harness.config.check import override_problems, validate
from harness.config.errors import (SINGLE_GROUPS, ConfigError, field_names, list_of_group_line,
                                   unknown_key_line)
from harness.config.schemas import BY_CLASS_NAME, ROOT_KEYS
from harness.config.tuned import (_WARNED, CONF_DIR, TUNED_GROUP, TUNED_ON_PREFIX, TUNED_OVERRIDE_MARK, available,
                                  decoder_key, suggestion, tuned_on, tuned_override_line, tuned_overrides,
                                  tuning_mismatches)

__all__ = ["CONF_DIR", "SINGLE_GROUPS", "TUNED_GROUP", "TUNED_ON_PREFIX", "TUNED_OVERRIDE_MARK", "ConfigError",
           "available", "compose", "decoder_key", "explain_compose_error", "field_names", "list_of_group_line",
           "override_problems", "refuse_group_lists", "show", "suggestion", "tuned_on", "tuned_override_line",
           "tuned_overrides", "tuning_mismatches", "validate", "_WARNED"]


def refuse_group_lists(overrides: Sequence[str]) -> None:
    """Raise :class:`ConfigError` for ``task=[a,b]`` / ``model=[a,b]`` (a list where one name is taken)."""
    for arg in overrides:
        key, sep, value = arg.lstrip("+~").partition("=")
        key = key.split("@")[0]
        if sep and key in SINGLE_GROUPS and value.strip().startswith("["):
            names = [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]
            raise ConfigError(list_of_group_line(key, names))


def explain_compose_error(exc: BaseException) -> ConfigError:
    """Hydra's composition error as a :class:`ConfigError` of one line that names the key and the valid keys."""
    texts = []
    e: BaseException | None = exc
    while e is not None and len(texts) < 4:
        texts.append(str(e))
        e = e.__cause__ or e.__context__
    text = "\n".join(texts)
    m_from = re.search(r"In '([\w/.\-]+)'", text)
    where = f" (in conf/{m_from.group(1)}.yaml)" if m_from else ""
    if re.search(r"Could not (override|append|delete)", text) or "override" in text.split("\n")[0]:
        where = " (on the command line)"
    m_group = re.search(r"In '(task|model|runner)/[^']*'.*not a subclass of", text, re.S)
    if m_group:
        return ConfigError(list_of_group_line(m_group.group(1)))
    m_unselected = re.search(r"Could not override '(decoder\.([^.']+)\.[^']*)'.*Key '\2' is not in struct", text, re.S)
    if m_unselected:
        key, name = m_unselected.groups()
        hint = suggestion(name, available("decoder"))
        if hint and decoder_key(hint) != name:  # a misspelt node name
            return ConfigError(f"{key}: no decoder {name!r} in this run; did you mean decoder.{decoder_key(hint)}"
                               f"{key[len(f'decoder.{name}'):]}? (settings apply to the selected decoders; "
                               "python run.py list decoder)")
        return ConfigError(f"{key}: no decoder {name!r} in this run; select it first "
                           f"(decoder=[vanilla,{hint or name}]) or fix the name (python run.py list decoder)")
    m_key = re.search(r"Key '([^']+)' (?:is )?not in (?:'(\w+)'|struct)", text)
    m_full = re.search(r"full_key: (\S+)", text)
    if m_key:
        key = m_key.group(1)
        full = m_full.group(1) if m_full else key
        path = full.rsplit(".", 1)[0] if "." in full else ""
        schema = BY_CLASS_NAME.get(m_key.group(2) or "")
        if schema is not None:
            return ConfigError(unknown_key_line(path, key, schema, where=where))
        if not path:
            return ConfigError(unknown_key_line("", key, None, valid=ROOT_KEYS, where=where))
    m_val = re.search(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", text)
    if m_val or "is not Optional" in text:
        full = m_full.group(1) if m_full else "?"
        kind = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}
        if m_val:
            return ConfigError(f"{full}={m_val.group(1)!r}{where}: must be {kind.get(m_val.group(3), m_val.group(3))}")
        return ConfigError(f"{full}=null{where}: must not be null")
    lines = [ln.strip() for ln in text.split("\n") if ln.strip() and not ln.strip().startswith("object_type")]
    return ConfigError(" ".join(dict.fromkeys(lines)))


def compose(overrides: Sequence[str] = (), *, config_name: str = "config", config_dir: Path | str = CONF_DIR,
            return_hydra_config: bool = False, check: bool = True) -> DictConfig:
    """Compose ``conf/`` like ``run.py`` does, then :func:`validate` (when ``check``).

    Returns the config as composed (interpolations unresolved; the ``hydra`` node only when asked for).

    Raises:
        ConfigError: a list for a single-choice group, an unknown key, a wrong type or a value out of bounds.
    """
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    refuse_group_lists(overrides)

    def _compose() -> DictConfig:
        try:
            return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
        except Exception as e:  # Hydra's ConfigCompositionException, OmegaConf's errors, MissingConfigException
            raise explain_compose_error(e) from e

    if GlobalHydra.instance().is_initialized():
        cfg = _compose()
    else:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = _compose()
    choices = dict(cfg.hydra.runtime.choices)
    if check:
        problems = override_problems(overrides, cfg)
        if problems:
            raise ConfigError("\n".join(problems))
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        validate(job, choices=choices)
    if not return_hydra_config:
        from omegaconf import open_dict

        with open_dict(cfg):
            del cfg["hydra"]
    return cfg
