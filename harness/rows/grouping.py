"""Result rows as the aggregation reads them: checks (:func:`check_columns`), defaults (:func:`prepare`),
configuration labels (``speculative (gamma=8)``), model pairs, run groups (rows of one setting; runs that
differ are never pooled, see :mod:`harness.rows.metrics`), sampled rows, quality columns and draft shapes.
Pure functions of DataFrames.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Mapping, Sequence

import pandas as pd

from harness.rows import legacy
from harness.rows.columns import (NULLABLE_OK_COLUMNS, REQUIRED_OK_COLUMNS, RUN_IDENTITY_FIELDS, fmt_value, norm, num)

log = logging.getLogger(__name__)


#: Identity fields that are hashes: shown in a group label only when no readable field tells the groups apart.
HASH_IDENTITY_FIELDS = ("group_identity",)
#: Identity fields kept when pooling (``pool=True``).
POOLED_IDENTITY_FIELDS = ("task", "target_model", "draft_model")
#: Score columns recognised when neither the caller nor the rows declare a task's quality columns.
KNOWN_QUALITY_COLUMNS = ("pass@1", "accuracy", "exact_match", "rouge1", "rouge2", "rougeL", "rougeLsum")
#: Keys of a decoder config that are not hyper-parameters.
NON_PARAM_KEYS = ("_target_", "_partial_", "uses_draft")


def ok_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with ``status == "ok"`` (all rows when there is no status column)."""
    return rows[rows["status"] == "ok"] if "status" in rows else rows


def params_of(s: Any) -> dict[str, Any]:
    """A row's ``decoder_params`` JSON as a dict (``{}`` for anything else)."""
    if isinstance(s, str):
        try:
            p = json.loads(s)
            return p if isinstance(p, dict) else {}
        except json.JSONDecodeError:
            return {}
    return {}


def decoder_param_columns(rows: pd.DataFrame) -> list[str]:
    """Hyper-parameter names found in the rows' ``decoder_params`` JSON, in first-seen order."""
    names: dict[str, None] = {}
    if "decoder_params" not in rows:
        return []
    for s in rows["decoder_params"].dropna().unique():
        names.update(dict.fromkeys(params_of(s)))
    return list(names)


def swept_params(rows: pd.DataFrame) -> dict[str, list[str]]:
    """decoder -> the hyper-parameters that take more than one value among its rows."""
    out: dict[str, list[str]] = {}
    if "decoder_params" not in rows:
        return {d: [] for d in dict.fromkeys(rows["decoder"])}
    for decoder, g in rows.groupby("decoder", sort=False):
        params = [params_of(s) for s in g["decoder_params"].dropna().unique()]
        keys = dict.fromkeys(k for p in params for k in p)
        out[decoder] = [k for k in keys if len({json.dumps(norm(p.get(k))) for p in params}) > 1]
    return out


def decoder_classes(rows: pd.DataFrame) -> pd.Series:
    """Per row: the decoder's class (``decoder_class``, :func:`harness.rows.legacy.upgrade` for older rows)."""
    return legacy.upgrade(rows)["decoder_class"].astype(str)


def swept_by_class(rows: pd.DataFrame) -> dict[str, list[str]]:
    """decoder class -> the hyper-parameters that take more than one value among its configurations (a grid
    of named configurations, ``lookahead_w4n3g4``, ``lookahead_w8n3g8``, ..., sweeps ``window_size`` and
    ``guess_set_size`` of ``LookaheadDecoder``): the x axes of the sweep figure. A list-valued setting (a fixed
    tree's ``paths``) is no axis: its configurations are told apart by their labels."""
    swept = swept_params(rows.assign(decoder=decoder_classes(rows)))
    listed = {k for ps in (rows["decoder_params"].dropna().unique() if "decoder_params" in rows else [])
              for k, v in params_of(ps).items() if isinstance(v, (list, tuple))}
    return {cls: [k for k in keys if k not in listed] for cls, keys in swept.items()}


def config_labels(rows: pd.DataFrame) -> pd.Series:
    """Label of each row's decoder configuration: the decoder name, plus ``(k=v, ...)`` for its
    hyper-parameters that vary among the rows (a gamma sweep gives ``speculative (gamma=2)``, ...;
    :func:`swept_parts`). Integral values print as integers."""
    return pd.Series([f"{dec} ({', '.join(parts)})" if parts else str(dec)
                      for dec, parts in zip(rows["decoder"], swept_parts(rows))], index=rows.index, dtype=object)


def swept_parts(rows: pd.DataFrame) -> list[list[str]]:
    """Per row: its configuration's hyper-parameters that vary among the rows' configurations of its decoder, as
    ``k=v`` texts (what :func:`config_labels` puts in parentheses); a fixed tree's shape as ``tree=`` its nodes per
    depth, written out where two swept shapes share them (:func:`param_text`)."""
    varying = swept_params(rows)
    params = rows["decoder_params"] if "decoder_params" in rows else pd.Series([None] * len(rows), index=rows.index)
    shapes: dict[str, set] = {}
    for dec, ps in zip(rows["decoder"], params):
        if "paths" in (varying.get(dec) or []):
            shapes.setdefault(dec, set()).add(json.dumps(norm(params_of(ps).get("paths"))))
    spelled = {dec for dec, vals in shapes.items()
               if len({param_text("paths", json.loads(v)) for v in vals}) < len(vals)}

    def parts(dec: str, p: Mapping[str, Any], drop_idle: bool) -> list[str]:
        return [f"{SHORT_NAMES.get(k, k)}={param_text(k, p.get(k), spelled=dec in spelled)}" if k == "paths" else
                f"{k}={fmt_value(p.get(k))}" for k in varying.get(dec) or [] if not (drop_idle and _idle(k, p))]

    rows_params = [(dec, params_of(ps) if varying.get(dec) else {}) for dec, ps in zip(rows["decoder"], params)]
    # A setting whose parent is off is left out (`draft_on_copy` of a tree that copies nothing), unless two
    # different configurations of a decoder would then read alike.
    reduced = [parts(dec, p, True) for dec, p in rows_params]
    seen: dict[tuple, set] = {}
    for (dec, p), r in zip(rows_params, reduced):
        seen.setdefault((dec, *r), set()).add(json.dumps({k: norm(v) for k, v in p.items()}, sort_keys=True,
                                                         default=str))
    return [r if len(seen[(dec, *r)]) == 1 else parts(dec, p, False) for (dec, p), r in zip(rows_params, reduced)]


def _idle(key: str, params: Mapping[str, Any]) -> bool:
    """Whether ``key`` means nothing in ``params``: it depends on another setting (:data:`DEPENDENT_PARAMS`) that
    is off there (absent, false, zero or empty)."""
    return key in DEPENDENT_PARAMS and norm(params.get(DEPENDENT_PARAMS[key])) in _OFF


def param_text(key: str, value: Any, spelled: bool = False) -> str:
    """A hyper-parameter's value as labels and settings show it (:func:`fmt_value`); a fixed tree's ``paths`` by its
    nodes per depth (``4+8+8+3+2``), or written out as ``[[0],[1],[0,0]]`` with ``spelled`` (two shapes of the same
    nodes per depth)."""
    if key == "paths" and isinstance(value, (list, tuple)):
        if spelled:
            return "[" + ",".join("[" + ",".join(map(str, p)) + "]" for p in value) + "]"
        from decoders.settings import tree_levels  # torch-free

        return "+".join(map(str, tree_levels(value)))
    return fmt_value(value)


#: Hyper-parameters always named in a configuration's settings (the field's core terms) ...
CORE_PARAMS = ("gamma", "window_size", "ngram_size", "guess_set_size", "topk", "max_ngram_size", "num_draft_tokens",
               "num_nodes", "paths")
#: ... their short names, and the names of extensions (a boolean one is named without its value when on) ...
SHORT_NAMES = {"window_size": "W", "ngram_size": "N", "guess_set_size": "G", "max_ngram_size": "n",
               "num_draft_tokens": "draft tokens", "num_nodes": "nodes", "paths": "tree",
               "num_assistant_tokens_schedule": "schedule", "assistant_confidence_threshold": "threshold",
               "pool_from_prompt": "prompt n-grams", "free_draft_min_match": "free drafts from",
               "draft_vocab_size": "draft vocab", "stop_confidence": "stop below", "branch_confidence": "branch below",
               "cost_aware": "cost-aware", "copy_tokens": "copy", "draft_on_copy": "draft on copy",
               "copy_min_match": "copy match", "guess_tokens": "guess", "draft_window": "draft window"}
#: ... and parameters that are bookkeeping, never shown (OPT-Tree's ``threshold`` and ``max_depth`` are settings, shown
#: off their defaults: budget-32 trees at depth 10 and at depth 16 must not read alike).
HIDDEN_PARAMS = ("seed", "pool_scope", "min_ngram_size", "max_branches")
#: Options that mean something only when another is on (option -> the one it depends on).
DEPENDENT_PARAMS = {"draft_on_copy": "copy_tokens", "copy_min_match": "copy_tokens",
                    "max_branches": "branch_confidence"}
#: Values that mean "off" when no schema default is at hand.
_OFF = (None, False, 0, 0.0, "")
#: Order of the settings when the caller gives none: the core terms, then the named extensions.
_ORDER = (*CORE_PARAMS, *SHORT_NAMES)


def settings_label(decoder_params: Any, defaults: Mapping[str, Any] | None = None,
                   order: Sequence[str] = (), hidden: Sequence[str] = HIDDEN_PARAMS,
                   decoder_class: str | None = None) -> str:
    """A configuration's settings as a reader compares them: the core hyper-parameters always, every other
    setting only when it is off its default (``defaults``: the decoder schema's, when the caller has them;
    else off means false, zero or empty), booleans by name; e.g. ``gamma=8`` or ``gamma=6, W=4, N=4, G=4,
    topk=3, prompt n-grams, free drafts from=3``. Empty for a decoder without settings.

    Args:
        decoder_params: the row's ``decoder_params`` (JSON text) or a dict.
        defaults: parameter -> default; ``None``: the declared defaults of the class its ``_target_`` (else
            ``decoder_class``) names (:func:`declare.declared_settings`), so every table and the
            README label a configuration alike; without a known class, off means false, zero or empty.
        order: parameter order (default: the declaration's, else :data:`_ORDER`); others follow in their own.
        hidden: parameters never shown (default :data:`HIDDEN_PARAMS`, the bookkeeping a reader of a table
            does not compare; a run's own summary passes none, so a sweep over ``threshold`` is named).
    """
    p = decoder_params if isinstance(decoder_params, Mapping) else params_of(decoder_params)
    target = p.get("_target_") or decoder_class
    if defaults is None and target:
        import decoders.settings  # noqa: F401  the decoders' declarations (torch-free), registered on import
        from declare import declared_settings

        declared, known = declared_settings("decoder", str(target))
        order, defaults = (order or declared), (known if declared else None)
    order = list(order) or list(_ORDER)
    keys = sorted(p, key=lambda k: order.index(k) if k in order else len(order))
    shown = []
    for k in keys:
        v = p[k]
        if k.startswith("_") or k in NON_PARAM_KEYS or k in hidden:
            continue
        if k in DEPENDENT_PARAMS and norm(p.get(DEPENDENT_PARAMS[k])) in _OFF:
            continue
        if k not in CORE_PARAMS:
            if defaults is not None and k in defaults and norm(defaults[k]) == norm(v):
                continue
            if (defaults is None or k not in defaults) and norm(v) in _OFF:
                continue
        name = SHORT_NAMES.get(k, k)
        shown.append(name if v is True else f"{name}={'default' if v is None else param_text(k, v)}")
    return ", ".join(shown)


def model_pair(rows: pd.DataFrame) -> pd.Series:
    """``target / draft`` per row (``target`` alone without a draft)."""
    target = rows["target_model"] if "target_model" in rows else pd.Series([None] * len(rows), index=rows.index)
    if "model" in rows:
        target = target.where(target.notna(), rows["model"])
    draft = rows["draft_model"] if "draft_model" in rows else pd.Series([None] * len(rows), index=rows.index)
    return pd.Series([str(t) if d is None or (isinstance(d, float) and math.isnan(d)) else f"{t} / {d}"
                      for t, d in zip(target, draft)], index=rows.index, dtype=object)


def identity_fields(rows: pd.DataFrame, pool: bool = False) -> list[str]:
    """The run-identity columns present in ``rows`` (:data:`RUN_IDENTITY_FIELDS`, or
    :data:`POOLED_IDENTITY_FIELDS` when pooling)."""
    fields = POOLED_IDENTITY_FIELDS if pool else RUN_IDENTITY_FIELDS
    return [f for f in fields if f in rows]


def _short(field: str, value: Any) -> str:
    v = fmt_value(value)
    if field in HASH_IDENTITY_FIELDS:
        return v[:8]
    return v[:7] if field == "git_commit" and len(v) > 12 else v


def _settings_names(labels: Sequence[str], keys: Sequence[tuple], settings: pd.Series) -> dict[tuple, str]:
    """(label, identity key) -> the run settings that tell the groups sharing that label apart
    (``runner.warmup=0``; the ``run_settings`` column, :func:`harness.rows.results.run_settings`), for labels whose
    every group has them and no two groups alike; other labels keep the hash."""
    by_label: dict[str, dict[tuple, set]] = {}
    for lab, k, text in zip(labels, keys, settings):
        by_label.setdefault(lab, {}).setdefault(k, set()).add(text if isinstance(text, str) else None)
    out: dict[tuple, str] = {}
    for lab, groups in by_label.items():
        parts = {k: [dict.fromkeys(t.split(", ")) for t in texts if t] for k, texts in groups.items()}
        if len(groups) < 2 or any(len(texts) != 1 or None in texts for texts in groups.values()):
            continue
        common = set.intersection(*(set(p[0]) for p in parts.values()))  # settings every group of the label shares
        names = {k: ", ".join(x for x in p[0] if x not in common) for k, p in parts.items()}
        if all(names.values()) and len(set(names.values())) == len(names):
            out.update({(lab, k): n for k, n in names.items()})
    return out


def run_groups(rows: pd.DataFrame, pool: bool = False) -> tuple[pd.Series, list[str]]:
    """Group label of each row (one group per setting, see the module docstring) and the identity fields that
    vary.

    The label is ``task: target / draft``, plus ``(field=value, ...)`` for the readable identity fields that
    differ between the groups (``git_commit`` shortened to 7 characters, e.g. ``temperature=0.7``); groups that the
    readable fields leave alike (two runs that differ in, say, the warm-up or the prompt style) are told apart by
    the run settings that differ (``[runner.warmup=0]``, from the run folders' ``meta.json``), else by the hash
    ``group_identity`` (8 characters). With ``pool=True`` only
    task and model pair separate groups, and a warning names the identity fields that were pooled.

    Returns:
        ``(labels, varying)``: a Series aligned with ``rows`` and the varying identity fields.
    """
    fields = identity_fields(rows, pool)
    keys = [tuple(norm(v) for v in t) for t in rows[fields].itertuples(index=False, name=None)] if fields else \
        [()] * len(rows)
    shown = {"task", "model", "target_model", "draft_model"}
    varying = [f for i, f in enumerate(fields) if len({k[i] for k in keys}) > 1]  # None counts as a value
    extra = [(i, f) for i, f in enumerate(fields) if f in varying and f not in shown
             and f not in HASH_IDENTITY_FIELDS]
    hashed = [(i, f) for i, f in enumerate(fields) if f in varying and f in HASH_IDENTITY_FIELDS]
    task = rows["task"].astype(str) if "task" in rows else pd.Series(["-"] * len(rows), index=rows.index)
    base = task + ": " + model_pair(rows)
    if extra:
        base = base + [" (" + ", ".join(f"{f}={_short(f, k[i])}" for i, f in extra) + ")" for k in keys]
    if hashed:
        label_keys: dict[str, set] = {}
        for lab, k in zip(base, keys):
            label_keys.setdefault(lab, set()).add(k)
        settings = rows["run_settings"] if "run_settings" in rows else pd.Series([None] * len(rows), index=rows.index)
        named = _settings_names(base, keys, settings)
        base = pd.Series([lab if len(label_keys[lab]) == 1 else
                          f"{lab} [{named[(lab, k)]}]" if (lab, k) in named else
                          f"{lab} [" + ", ".join(f"{f}={_short(f, k[i])}" for i, f in hashed) + "]"
                          for lab, k in zip(base, keys)], index=rows.index, dtype=object)
    if pool:
        hidden = [f for f in identity_fields(rows) if f not in fields and len({norm(v) for v in rows[f]}) > 1]
        if hidden:
            log.warning("POOLING rows that differ in %s (pool=True): the numbers mix runs that are not the same "
                        "experiment", ", ".join(hidden))
    return base.astype(object), varying


def is_sampled(rows: pd.DataFrame) -> pd.Series:
    """Per row: whether it was sampled (``equality_check`` says so, or ``temperature > 0``); rows without
    either column were greedy (the harness sampled nothing before these columns existed)."""
    out = pd.Series(False, index=rows.index, dtype=bool)
    if "equality_check" in rows:
        out |= rows["equality_check"].astype(str).str.startswith("n/a")
    if "temperature" in rows:
        out |= num(rows["temperature"]).fillna(0) > 0
    return out


def prepare(rows: pd.DataFrame, pool: bool = False) -> pd.DataFrame:
    """``rows`` with the columns every aggregate needs: ``model_pair``, ``label`` (decoder configuration; a
    sweep's vanilla rows named by their run, :func:`run_vanilla_labels`), ``group`` (run identity), on rows read as
    today's (:func:`harness.rows.legacy.upgrade`: what older rows lack). Idempotent."""
    check_columns(rows)
    rows = legacy.upgrade(rows)
    rows["model_pair"] = model_pair(rows)
    if "label" not in rows:
        rows["label"] = config_labels(rows)
    if "group" not in rows or pool:
        rows["group"], _ = run_groups(rows, pool)
    rows["label"] = run_vanilla_labels(rows)
    return rows


def run_ids(rows: pd.DataFrame) -> pd.Series:
    """The run each row comes from: its ``run_identity`` (the shards of one run share it), else its ``run_dir``
    (rows written before run identities existed); None where neither is known."""
    for col in ("run_identity", "run_dir"):
        if col in rows and rows[col].notna().all():
            return rows[col].astype(str)
    return pd.Series([None] * len(rows), index=rows.index, dtype=object)


def run_vanilla_labels(rows: pd.DataFrame) -> pd.Series:
    """``rows``' labels, with each vanilla row named by its run where its group holds the runs of a sweep over
    decoder settings: the jobs of ``decoder.speculative.gamma=2,4`` each measure their own vanilla, and every other
    row's speedup is paired with its own run's, so one vanilla row pooled over the jobs would hold tok/s that no
    speedup was computed from. The name is the settings that tell the run's other configurations apart
    (``vanilla (gamma=4)``, from ``speculative (gamma=4)``); runs that no setting tells apart (seed replicates,
    shards, repeated runs) keep one pooled ``vanilla`` row. Idempotent (only rows labelled ``vanilla`` change)."""
    labels = rows["label"].copy()
    if "group" not in rows or "decoder_params" not in rows:
        return labels
    parts = pd.Series(swept_parts(rows), index=rows.index, dtype=object)
    for _, g in rows.assign(_run=run_ids(rows)).groupby("group", sort=False):
        names: dict[Any, str] = {}
        for run, r in g.groupby("_run", sort=False):
            names[run] = ", ".join(dict.fromkeys(part for i in r.index[r["decoder"] != "vanilla"]
                                                 for part in parts[i]))
        if len(names) < 2 or len(set(names.values())) < 2 or not all(names.values()):
            continue
        for run, name in names.items():
            mine = g.index[(g["_run"] == run) & (g["decoder"] == "vanilla") & (g["label"] == "vanilla")]
            labels.loc[mine] = f"vanilla ({name})"
    return labels


def check_columns(rows: pd.DataFrame) -> None:
    """Refuse rows whose ``ok`` rows lack a column of :data:`REQUIRED_OK_COLUMNS` (or miss its value; only
    ``tokens_per_s`` may be null, where a call took no measurable time: such a row is left out of the speed
    figures, never counted as 0).

    Raises:
        ValueError: naming the missing columns and how many ok rows lack them; the rows were not written by
            this harness's runner (or :mod:`harness.exchange.specbench`'s import), or were edited.
    """
    ok = ok_rows(rows)
    if ok.empty:
        return
    absent = [c for c in REQUIRED_OK_COLUMNS if c not in ok]
    empty = {c: int(ok[c].isna().sum()) for c in REQUIRED_OK_COLUMNS
             if c in ok and c not in NULLABLE_OK_COLUMNS and ok[c].isna().any()}
    if absent or empty:
        what = [f"{c} (no such column)" for c in absent] + [f"{c} (null in {n} of {len(ok)} ok rows)"
                                                              for c, n in empty.items()]
        raise ValueError(f"result rows with status ok lack {', '.join(what)}: every number of the summary, report "
                         "and gate is computed from these columns; re-run the cells with the harness's runner "
                         "(or fix the rows) rather than aggregate them")


def quality_columns(rows: pd.DataFrame, declared: Sequence[str] | None = None) -> list[str]:
    """The quality (score) columns to report, in this order of preference:

    1. ``declared``: a task's ``quality_columns`` (the runner passes them), those present in ``rows``;
    2. a ``quality_columns`` column in the rows (a list, or JSON text of one);
    3. the score columns of the project's tasks found in the rows (:data:`KNOWN_QUALITY_COLUMNS`).
    """
    if declared is not None:
        return [c for c in declared if c in rows]
    if "quality_columns" in rows:
        names: dict[str, None] = {}
        for v in rows["quality_columns"].dropna():
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    v = [v]
            names.update(dict.fromkeys(str(x) for x in v))
        return [c for c in names if c in rows]
    return [c for c in KNOWN_QUALITY_COLUMNS if c in rows and num(rows[c]).notna().any()]


_find_quality = quality_columns  # summarize()'s argument shadows the name


#: The draft shape each decoder family declares (``draft_shape`` of its class, :class:`decoders.types.Decoder`), by the
#: prefix of its config name: what rows written before the column existed are read as.
LEGACY_DRAFT_SHAPES = {"speculative": "chain", "hf_assisted": "dynamic chain", "lookahead": "n-grams",
                       "prompt_lookup": "copy", "ouroboros": "phrases", "opt_tree": "tree", "fixed_tree": "tree"}


def draft_shape(g: pd.DataFrame) -> str:
    """What one cell's decoder verifies per step (its rows' ``draft_shape``, :class:`decoders.types.Decoder`);
    rows written before the column existed: the shape its family declares (:data:`LEGACY_DRAFT_SHAPES`, by the
    longest prefix of the decoder's name), ``none`` without draft tokens, else ``unknown``."""
    if "draft_shape" in g and g["draft_shape"].notna().any():
        return str(g["draft_shape"].dropna().iloc[0])
    drafted = num(g["num_drafted"]).fillna(0).sum() if "num_drafted" in g else 0
    name = str(g["decoder"].iloc[0])
    families = [f for f in LEGACY_DRAFT_SHAPES if name.startswith(f)]
    if families and (drafted or name.startswith("speculative")):
        return LEGACY_DRAFT_SHAPES[max(families, key=len)]
    return "none" if not drafted else "unknown"
