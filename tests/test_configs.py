"""Config integrity: every config composes and instantiates; every group has a typed schema
(harness/config/schemas.py, generated from the registered decoders and tasks; checked by harness/config/check.py)
that refuses unknown keys with the valid names and values out of bounds with their range, before any task data is
read or any model is fetched or loaded; schemas and constructors cannot drift."""

from __future__ import annotations

import dataclasses
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf

import harness.job.app
import harness.config.precheck
import harness.job.model_cache
import harness.job.models
from harness.config import compose as C
from harness.config import schemas as S
from harness.job.app import build_decoder, main_job
from harness.config.precheck import check_choices, precheck
from harness.config.compose import ConfigError, compose

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
TINY = ["model=tiny-random", "task.limit=1", "runner.max_new_tokens=4", "runner.warmup=0", "runner.score=false"]


def _names(group):
    """The configs of a group as they are selected: ``speculative``, and for decoders also the generated
    ``tuned/speculative_tuned``."""
    return harness.config.precheck.available(group)


def _key(name):
    """The node a selected decoder config fills: ``tuned/speculative_tuned`` -> ``speculative_tuned``."""
    return name.rsplit("/", 1)[-1]


def _yaml(group, name):
    return yaml.safe_load((CONF / group / f"{name}.yaml").read_text())


# ---------------------------------------------------------------------------------------------- composing
def test_main_job_config():
    cfg = compose([])
    assert cfg.model.name == "qwen2.5-coder-1.5b"
    assert cfg.model.dtype == "auto"      # bfloat16 where computed natively, else float32 (harness.job.models.resolve_dtype)
    assert cfg.task.name == "humaneval" and cfg.task.limit == 5
    assert cfg.runner.max_new_tokens == 128
    assert list(cfg.decoder) == ["vanilla", "speculative", "hf_assisted"]


@pytest.mark.parametrize("model", _names("model"))
def test_model_configs_compose(model):
    cfg = compose([f"model={model}", "decoder=[vanilla]"])
    assert cfg.model.target.source
    assert cfg.model.dtype in S.DTYPES


@pytest.mark.parametrize("task", _names("task"))
def test_task_configs_compose(task):
    cfg = compose([f"task={task}"])
    assert cfg.task._target_.startswith("tasks.")


@pytest.mark.parametrize("decoder", _names("decoder"))
def test_decoder_configs_instantiate(decoder, target, noisy_draft, eos_ids, tokenizer):
    cfg = compose(["model=tiny-random", f"decoder=[{decoder}]"])
    node = OmegaConf.to_container(cfg.decoder[_key(decoder)], resolve=True)
    dec = build_decoder(node, {"target_model": target, "draft_model": noisy_draft, "eos_token_ids": eos_ids,
                               "tokenizer": tokenizer})
    assert hasattr(dec, "generate")


def test_decoder_hyperparameters_are_overridable():
    cfg = compose(["decoder=[vanilla,speculative]", "decoder.speculative.gamma=6"])
    assert cfg.decoder.speculative.gamma == 6


@pytest.mark.parametrize("group,name", [(g, n) for g in ("model", "runner", "task", "decoder") for n in _names(g)])
def test_every_yaml_lists_its_schema_first(group, name):
    """Hydra's schema pattern: the first default is the group's base_* schema, and the composed node has its type
    (a generated config in ``decoder/tuned/`` names it by its absolute path, ``/decoder/<schema>@_here_``)."""
    first = _yaml(group, name)["defaults"][0]
    if name.startswith("tuned/"):
        assert first.startswith("/decoder/") and first.endswith("@_here_"), first
        first = first[len("/decoder/"):-len("@_here_")]
    assert first in S.SCHEMAS[group], f"conf/{group}/{name}.yaml starts its defaults with {first!r}"
    overrides = {"model": [f"model={name}", "decoder=[vanilla]"], "runner": [f"runner={name}"],
                 "task": [f"task={name}"], "decoder": ["model=tiny-random", f"decoder=[{name}]"]}[group]
    cfg = compose(overrides)
    node = cfg.decoder[_key(name)] if group == "decoder" else cfg[group]
    assert OmegaConf.get_type(node) is S.SCHEMAS[group][first]


# ---------------------------------------------------------------------------------------------- no drift
def _params(cls):
    return {n: p for n, p in inspect.signature(cls).parameters.items() if n != "self"}


@pytest.mark.parametrize("schema", list(S.SCHEMAS["decoder"].values()), ids=lambda s: s.__name__)
def test_decoder_schema_fields_equal_constructor_parameters(schema):
    """Schema fields = constructor parameters (minus the runner-supplied ones), same defaults, no **kwargs;
    uses_draft is fixed to whether the constructor takes a draft model."""
    cls = hydra.utils.get_class(schema._target_)
    params = _params(cls)
    assert not [p for p in params.values() if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)], \
        f"{cls.__name__} shows **kwargs: its signature must list its settings"
    fields = {f.name: f for f in dataclasses.fields(schema)}
    assert set(fields) - set(S.DECODER_META_KEYS) == set(params) - set(S.RUNNER_SUPPLIED), \
        f"{schema.__name__} and {cls.__name__}.__init__ differ: declare the setting in decoders/settings.py"
    for name in set(fields) - set(S.DECODER_META_KEYS):
        assert fields[name].default == params[name].default, (name, fields[name].default, params[name].default)
    assert fields["uses_draft"].default == ("draft_model" in params)


@pytest.mark.parametrize("schema", list(S.SCHEMAS["decoder"].values()), ids=lambda s: s.__name__)
def test_a_misspelt_decoder_setting_is_refused_not_swallowed(schema, target, noisy_draft, eos_ids):
    """A decoder takes its settings as keyword arguments: one it does not declare is a TypeError naming it."""
    supplied = {"target_model": target, "draft_model": noisy_draft, "eos_token_ids": eos_ids, "tokenizer": None}
    with pytest.raises(TypeError, match="gama"):
        build_decoder({"_target_": schema._target_, "_partial_": True, "gama": 1}, supplied)


@pytest.mark.parametrize("schema", list(S.SCHEMAS["task"].values()), ids=lambda s: s.__name__)
def test_task_schema_fields_equal_constructor_parameters(schema):
    cls = hydra.utils.get_class(schema._target_)
    params = {n: p for n, p in _params(cls).items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    fields = {f.name: f for f in dataclasses.fields(schema)}
    assert set(fields) - {"_target_", "name"} == set(params)
    for name in params:
        assert fields[name].default == params[name].default, name
    assert fields["name"].default == cls.name


def test_run_settings_are_the_runner_schema_declared_once():
    from harness.job.run_settings import RunSettings

    assert issubclass(RunSettings, S.RunnerConfig)   # the same declaration, not a mirror
    assert {f.name for f in dataclasses.fields(RunSettings)} - {f.name for f in dataclasses.fields(S.RunnerConfig)} \
        == {"extra"}
    with pytest.raises(ValueError, match=r"^runner\.warmup_tokens=0: must be an integer >= 1"):
        RunSettings(warmup_tokens=0)   # a bound only the declaration states

def test_named_choices_match_the_code():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert set(S.ATTN_IMPLEMENTATIONS) == {"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()}
    assert set(S.SOURCE_FIELDS) == set(S.MODEL_SOURCES) == set(harness.job.model_cache.SOURCES)
    spec_fields = {f.name for f in dataclasses.fields(S.ModelSpec)} - {"name", "source"}
    assert spec_fields == {k for req, opt in S.SOURCE_FIELDS.values() for k in (*req, *opt)}


def _bound_cases():
    """(schema, field, accepted value, refused value) at every numeric or named bound of a decoder schema."""
    cases = []
    for schema in S.SCHEMAS["decoder"].values():
        for f in dataclasses.fields(schema):
            meta = f.metadata
            if f.name in S.DECODER_META_KEYS:
                continue
            if "choices" in meta:
                cases.append((schema, f.name, meta["choices"][0], "not-a-choice"))
            if "ge" in meta:
                lo = meta["ge"]
                cases.append((schema, f.name, lo, lo - (1 if isinstance(lo, int) else 0.5)))
            if "le" in meta:
                cases.append((schema, f.name, meta["le"], meta["le"] + 0.5))
    return cases


@pytest.mark.parametrize("schema,name,good,bad", [
    pytest.param(*c, id=f"{c[0].__name__}.{c[1]}={c[3]}") for c in _bound_cases()])
def test_schema_bounds_mirror_the_constructor_checks(schema, name, good, bad, target, noisy_draft, eos_ids, tokenizer):
    """At each bound the constructor accepts the value the schema accepts and refuses the one it refuses."""
    supplied = {"target_model": target, "draft_model": noisy_draft, "eos_token_ids": eos_ids, "tokenizer": tokenizer}
    node = {f.name: f.default for f in dataclasses.fields(schema)}
    build_decoder({**node, name: good}, supplied)
    with pytest.raises(ValueError):
        build_decoder({**node, name: bad}, supplied)
    with pytest.raises(ConfigError, match=rf"decoder\.x\.{name}="):
        C.validate({**compose(["model=tiny-random", "decoder=[vanilla]"]), "decoder": {"x": {**node, name: bad}}})


# ---------------------------------------------------------------------------------------------- unknown keys
def _conf_copy(tmp_path, edit):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    edit(conf)
    return conf


def test_misspelt_key_in_a_decoder_yaml_is_refused_at_compose_time(tmp_path):
    """Before: a decoder YAML with `gama: 8` ran gamma 4 and recorded gama=8."""
    def edit(conf):
        p = conf / "decoder" / "speculative.yaml"
        p.write_text(p.read_text() + "gama: 8\n")
    conf = _conf_copy(tmp_path, edit)
    with pytest.raises(ConfigError) as e:
        compose(["model=tiny-random", "decoder=[vanilla,speculative]"], config_dir=conf)
    msg = str(e.value)
    assert "unknown key decoder.speculative.gama" in msg and "conf/decoder/speculative.yaml" in msg
    assert "takes gamma" in msg and "\n" not in msg
    # Hydra itself refuses it too (not only our wrapper): the schema is part of the composition
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"), pytest.raises(Exception, match="gama"):
        hydra_compose("config", overrides=["decoder=[vanilla,speculative]"])


@pytest.mark.parametrize("group,name,typo,valid", [
    ("task", "gsm8k", "num_fewshots: 0", "num_fewshot"),
    ("runner", "default", "warmups: 0", "warmup"),
    ("model", "tiny-random", "dtpye: float32", "dtype"),
])
def test_misspelt_key_in_a_task_runner_or_model_yaml_is_refused(tmp_path, group, name, typo, valid):
    def edit(conf):
        p = conf / group / f"{name}.yaml"
        p.write_text(p.read_text() + f"\n{typo}\n")
    conf = _conf_copy(tmp_path, edit)
    overrides = ["model=tiny-random", "decoder=[vanilla]"] + ([f"task={name}"] if group == "task" else [])
    with pytest.raises(ConfigError, match=rf"unknown key {group}\.{typo.split(':')[0]} .*takes .*\b{valid}\b"):
        compose(overrides, config_dir=conf)


@pytest.mark.parametrize("override,key,valid", [
    # the reproducers: each exited 0 and recorded the value in the rows
    ("+decoder.speculative.temperature=0.7", "decoder.speculative.temperature", "gamma"),
    ("+decoder.hf_assisted.do_sample=true", "decoder.hf_assisted.do_sample", "num_assistant_tokens_schedule"),
    ("+decoder.speculative.batch_size=2", "decoder.speculative.batch_size", "gamma"),
    ("decoder.speculative.gama=8", "decoder.speculative.gama", "gamma"),
    ("+task.limitt=3", "task.limitt", "limit"),
    ("task.limitt=3", "task.limitt", "limit"),
    ("runner.max_new_token=3", "runner.max_new_token", "max_new_tokens"),
    ("+runner.warmups=0", "runner.warmups", "warmup"),
    ("+model.dtpye=float32", "model.dtpye", "dtype"),
    ("+model.target.revison=main", "model.target.revison", "revision"),
    ("+devcie=cpu", "devcie", "device"),
])
def test_misspelt_key_on_the_command_line_is_refused_with_valid_names(override, key, valid):
    with pytest.raises(ConfigError) as e:
        compose(["model=tiny-random", "decoder=[vanilla,speculative,hf_assisted]", override])
    msg = str(e.value)
    assert f"unknown key {key}" in msg and valid in msg.split("takes", 1)[1], msg
    assert "\n" not in msg


def test_inline_experiment_decoder_is_checked_by_its_target():
    """experiment=lookahead_grid defines decoders inline (no YAML, no schema default): still checked."""
    with pytest.raises(ConfigError, match=r"unknown key decoder\.lookahead_w4n3g4\.gama.*window_size"):
        compose(["experiment=lookahead_grid", "+decoder.lookahead_w4n3g4.gama=1"])
    with pytest.raises(ConfigError, match=r"decoder\.lookahead_w5n4g5\.ngram_size=1: must be an integer >= 2"):
        compose(["experiment=lookahead_grid", "decoder.lookahead_w5n4g5.ngram_size=1"])


@pytest.mark.parametrize("override,line", [
    ("decoder.speculative._target_=decoders.vanilla.VanillaDecoder",
     "decoder.speculative._target_='decoders.vanilla.VanillaDecoder': fixed by its config (must be "
     "'decoders.speculative.SpeculativeDecoder')"),
    ("task._target_=tasks.gsm8k.GSM8K", "task._target_='tasks.gsm8k.GSM8K': fixed by its config (must be "
     "'tasks.humaneval.HumanEval')"),
    ("task.name=gsm8k", "task.name='gsm8k': fixed by tasks.humaneval.HumanEval (must be 'humaneval')"),
])
def test_a_configs_class_and_task_name_are_fixed(override, line):
    """Rows are labelled by the config's name: another class (or another task name) under it would be a wrong
    label, so an override of ``_target_`` or ``task.name`` is one line, and the only one (not the other class's
    complaints about the keys it does not take)."""
    with pytest.raises(ConfigError) as err:
        compose(["task=humaneval", "decoder=[vanilla,speculative]", override])
    assert str(err.value).startswith(line) and "\n" not in str(err.value), str(err.value)


def test_uses_draft_is_a_config_key_fixed_per_decoder(target, eos_ids):
    with pytest.raises(ConfigError, match=r"decoder\.speculative\.uses_draft=false: fixed by"):
        compose(["decoder=[vanilla,speculative]", "decoder.speculative.uses_draft=false"])
    dec = build_decoder({"_target_": "decoders.vanilla.VanillaDecoder", "_partial_": True, "uses_draft": False},
                        {"target_model": target, "draft_model": None, "eos_token_ids": eos_ids, "tokenizer": None})
    assert dec.eos_token_ids == frozenset(eos_ids)


# ---------------------------------------------------------------------------------------------- bounds
BOUNDS = [
    # (overrides, the one line expected)
    (["decoder.speculative.gamma=0"], "decoder.speculative.gamma=0: must be an integer >= 1"),
    (["decoder=[ouroboros]", "decoder.ouroboros.gamma=0"], "decoder.ouroboros.gamma=0: must be an integer >= 1"),
    (["decoder=[lookahead]", "decoder.lookahead.window_size=0"], "decoder.lookahead.window_size=0: must be an integer >= 1"),
    (["decoder=[lookahead]", "decoder.lookahead.ngram_size=1"], "decoder.lookahead.ngram_size=1: must be an integer >= 2"),
    (["decoder=[lookahead]", "decoder.lookahead.guess_set_size=-1"],
     "decoder.lookahead.guess_set_size=-1: must be an integer >= 0"),
    (["decoder=[lookahead]", "decoder.lookahead.pool_scope=global"],
     "decoder.lookahead.pool_scope='global': must be one of sample, task"),
    (["decoder=[ouroboros]", "decoder.ouroboros.topk=-1"], "decoder.ouroboros.topk=-1: must be an integer >= 0"),
    (["decoder=[ouroboros]", "decoder.ouroboros.seed=-1"], "decoder.ouroboros.seed=-1: must be an integer >= 0"),
    (["decoder=[hf_assisted]", "decoder.hf_assisted.gamma=0"], "decoder.hf_assisted.gamma=0: must be an integer >= 1 or null"),
    (["decoder=[hf_assisted]", "decoder.hf_assisted.num_assistant_tokens_schedule=fast"],
     "decoder.hf_assisted.num_assistant_tokens_schedule='fast': must be one of constant, heuristic, heuristic_transient or null"),
    (["decoder=[hf_assisted]", "decoder.hf_assisted.assistant_confidence_threshold=1.5"],
     "decoder.hf_assisted.assistant_confidence_threshold=1.5: must be a number in [0.0, 1.0] or null"),
    (["decoder=[prompt_lookup]", "decoder.prompt_lookup.max_ngram_size=0"],
     "decoder.prompt_lookup.max_ngram_size=0: must be an integer >= 1"),
    (["decoder=[prompt_lookup]", "decoder.prompt_lookup.num_draft_tokens=0"],
     "decoder.prompt_lookup.num_draft_tokens=0: must be an integer >= 1"),
    (["decoder=[prompt_lookup]", "decoder.prompt_lookup.min_ngram_size=4"],
     "decoder.prompt_lookup.min_ngram_size=4: must be <= max_ngram_size (3)"),
    (["task.limit=0"], "task.limit=0: must be an integer >= 1 or null"),
    (["task.max_new_tokens=0"], "task.max_new_tokens=0: must be an integer >= 1"),
    (["task.prompt_style=fancy"], "task.prompt_style='fancy': must be one of auto, chat, completion"),
    (["task.timeout_s=0"], "task.timeout_s=0.0: must be a number in [0.1, 3600]"),
    (["task=gsm8k", "task.num_fewshot=9"], "task.num_fewshot=9: must be an integer in [0, 8]"),
    (["task=mt_bench", "task.max_turns=0"], "task.max_turns=0: must be an integer >= 1 or null"),
    (["task=cnn_dm", "task.chat_prompt=Summarize."],
     "task.chat_prompt='Summarize.': must be a string containing '{article}'"),
    (["runner.max_new_tokens=0"], "runner.max_new_tokens=0: must be an integer >= 1 or null"),
    (["runner.warmup=-1"], "runner.warmup=-1: must be an integer >= 0"),
    (["runner.warmup_tokens=0"], "runner.warmup_tokens=0: must be an integer >= 1"),
    (["runner.seed=-1"], "runner.seed=-1: must be an integer >= 0"),
    (["runner.sample_ids=HumanEval/0"], "runner.sample_ids='HumanEval/0': must be a non-empty list of sample ids"),
    (["model.dtype=float8"], "model.dtype='float8': must be one of auto, bfloat16, float16, float32"),
    (["model.attn_implementation=fast"], "model.attn_implementation='fast': must be one of eager, sdpa"),
    (["model.target.seed=-1"], "model.target.seed=-1: must be an integer >= 0 or null"),
    (["+model.target.path=/x"], "model.target.path='/x': not used by source tiny_random"),
    (["device=gpu"], "device='gpu': must be auto, cpu, cuda"),
    (["model.draft=null"], "decoders ['speculative'] need a draft model but model=tiny-random has none"),
]


@pytest.mark.parametrize("overrides,line", BOUNDS, ids=[b[1].split(":")[0] for b in BOUNDS])
def test_value_out_of_bounds_is_one_line_naming_key_value_and_range(overrides, line):
    with pytest.raises(ConfigError) as e:
        compose(["model=tiny-random", "decoder=[vanilla,speculative]", *overrides])
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


def test_wrong_type_is_refused_at_compose_time():
    with pytest.raises(ConfigError, match=r"^decoder\.speculative\.gamma='abc' \(on the command line\): must be an integer$"):
        compose(["decoder.speculative.gamma=abc"])
    with pytest.raises(ConfigError, match=r"decoder\.speculative\.gamma=null.*must not be null"):
        compose(["decoder.speculative.gamma=null"])


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        compose(["model=tiny-random", "decoder=[vanilla,lookahead]", "decoder.lookahead.window_size=0",
                 "decoder.lookahead.pool_scope=x", "runner.warmup=-1", "+task.limitt=1"])
    lines = str(e.value).splitlines()
    assert len(lines) == 4
    for key in ("decoder.lookahead.window_size=", "decoder.lookahead.pool_scope=", "runner.warmup=", "key task.limitt:"):
        assert sum(key in ln for ln in lines) == 1, (key, lines)


# ---------------------------------------------------------------------------------------------- group lists
@pytest.mark.parametrize("arg,group", [("task=[humaneval,mbpp]", "task"),
                                       ("model=[tiny-random,smollm2-135m]", "model")])
def test_list_for_a_single_choice_group_points_to_multirun(arg, group):
    """Before: `task=[humaneval,mbpp]` ran only MBPP without a word."""
    names = arg.split("=")[1].strip("[]")
    hint = f"python run.py -m {group}={names}"
    with pytest.raises(ConfigError, match=hint.replace(".", r"\.")):
        check_choices([arg])
    with pytest.raises(ConfigError, match=hint.replace(".", r"\.")):
        compose([arg, "decoder=[vanilla]"])
    # a config Hydra composed with the list anyway (e.g. from a file) is caught by its recorded choices
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        try:
            cfg = hydra_compose("config", overrides=[arg, "decoder=[vanilla]"], return_hydra_config=True)
        except Exception:
            return  # the schemas differ (humaneval vs mbpp): Hydra refuses the merge itself
    with pytest.raises(ConfigError, match=f"-m {group}="):
        C.validate(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), choices=cfg.hydra.runtime.choices)


@pytest.mark.parametrize("arg,group", [("model=nope", "model"), ("decoder=[vanilla,nope]", "decoder"),
                                       ("task=nope", "task")])
def test_unknown_names_list_choices(arg, group):
    with pytest.raises(ConfigError) as e:
        check_choices([arg])
    assert f"Valid choices for {group}" in str(e.value)
    for name in _names(group):
        assert name in str(e.value)


# ---------------------------------------------------------------------------------------------- before anything runs
@pytest.fixture
def nothing_may_load(monkeypatch):
    """Any model fetch/load or task data read fails the test."""
    def boom(what):
        def fail(*a, **k):
            raise AssertionError(f"{what} happened before the config was refused")
        return fail

    monkeypatch.setattr(harness.job.app, "load_pair", boom("load_pair"))
    monkeypatch.setattr(harness.job.models, "load_pair", boom("load_pair"))
    monkeypatch.setattr(harness.job.models, "materialize", boom("materialize (fetch/convert)"))
    monkeypatch.setattr(harness.job.models, "load_model", boom("load_model"))
    import tasks.humaneval

    monkeypatch.setattr(tasks.humaneval, "read_jsonl", boom("reading HumanEval data"))


@pytest.mark.parametrize("overrides,line", [b for b in BOUNDS if not b[0][0].startswith("+")],
                         ids=[b[1].split(":")[0] for b in BOUNDS if not b[0][0].startswith("+")])
def test_main_job_refuses_before_reading_data_or_loading_models(overrides, line, tmp_path, nothing_may_load):
    """Before: `decoder.speculative.gamma=0` printed a traceback only after both models loaded."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["model=tiny-random", "decoder=[vanilla,speculative]", *overrides,
                                                  f"+output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="^" + re.escape(line)):
        main_job(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override", ["+decoder.speculative.temperature=0.7", "+decoder.speculative.batch_size=2",
                                      "+task.limitt=3"])
def test_main_job_refuses_unknown_keys_before_anything(override, tmp_path, nothing_may_load):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["model=tiny-random", "decoder=[vanilla,speculative]", override,
                                                  f"+output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="unknown key"):
        main_job(cfg)


@pytest.mark.parametrize("argv,line", [
    (["-m", "model=tiny-random", "decoder=[vanilla,speculative]", "decoder.speculative.gamma=2,0"],
     "decoder.speculative.gamma=0: must be an integer >= 1"),
    (["-m", "model=tiny-random", "decoder=[vanilla,lookahead]", "decoder.lookahead.pool_scope=sample,warm"],
     "decoder.lookahead.pool_scope='warm': must be one of sample, task"),
    (["-m", "model=tiny-random", "task=humaneval,gsm8k", "task.limit=0"], "task.limit=0: must be an integer >= 1"),
    (["experiment=gamma_ablation", "decoder.ouroboros.topk=-1"], "decoder.ouroboros.topk=-1: must be an integer >= 0"),
    (["experiment=lookahead_sweep", "decoder.lookahead.ngram_size=1,3"], "decoder.lookahead.ngram_size=1: must be"),
    # a preset is a sweep: Hydra would ignore hydra.run.dir and write into the preset's own folder
    (["experiment=gamma_ablation", "hydra.run.dir=/tmp/mine"], "hydra.run.dir=/tmp/mine: a sweep (-m, or an "
     "experiment that sets hydra.mode=MULTIRUN) writes under hydra.sweep.dir, one subfolder per job; write "
     "hydra.sweep.dir=/tmp/mine instead"),
])
def test_precheck_covers_every_job_of_a_sweep(argv, line, nothing_may_load):
    with pytest.raises(ConfigError, match="^" + re.escape(line)):
        precheck(argv)


def test_precheck_passes_valid_sweeps_and_experiments(nothing_may_load, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path))   # presets that read ../shared/data, wherever the clone is
    precheck(["-m", "model=tiny-random", "decoder=[vanilla,speculative]", "decoder.speculative.gamma=1,2,4"])
    for name in _names("experiment"):
        if harness.config.precheck.missing_decoder_configs(name):  # held-out races before tuning: tests/test_experiments.py
            continue
        precheck([f"experiment={name}"])


@pytest.mark.parametrize("args,line", [
    (["decoder.speculative.gamma=0"], "error: decoder.speculative.gamma=0: must be an integer >= 1"),
    (["+decoder.speculative.temperature=0.7"],
     "error: unknown key decoder.speculative.temperature: decoder.speculative "
     "(decoders.speculative.SpeculativeDecoder) takes gamma, draft_window (and _target_, _partial_, uses_draft); "
     "sampling settings are set once for every decoder of a run: runner.temperature, runner.top_p, runner.top_k, "
     "runner.seed "
     "(e.g. runner.temperature=0.7)"),
    (["task=[humaneval,mbpp]"], "error: task=[humaneval,mbpp]: task takes one name per run (Hydra would merge the "
                                "list silently); to run several, sweep them: python run.py -m task=humaneval,mbpp"),
])
def test_run_py_prints_one_line_and_exits_2(args, line, tmp_path):
    """The command-line experience: one `error:` line on stderr, exit status 2, no traceback, no run folder."""
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, "run.py", *TINY, "decoder=[vanilla,speculative]", *args,
                          f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.strip() == line and res.stdout == ""
    assert not run_dir.exists()
