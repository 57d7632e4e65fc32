"""Settings declared once (:mod:`declare`): the constructor, the Hydra schema and ``run.py list`` read one
declaration, so a default or a bound changed there changes all three."""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
from omegaconf import OmegaConf

import decoders.settings as D
from declare import at_least, between, check_args, one_of, rows, rule_text, setting
from harness.config import schemas as S
from harness.config.compose import ConfigError, compose
from harness.config.precheck import list_configs

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Knobs:
    size: int = setting(4, at_least(1), "items per step")
    share: float = setting(0.5, between(0.0, 1.0), "a fraction")
    mode: str = setting("a", one_of("a", "b"), "which one")
    cap: Optional[int] = setting(None, at_least(2), "null: none")
    flag: bool = setting(False, None, "on or off")


@pytest.mark.parametrize("values,line", [
    (dict(size=0), "size=0: must be an integer >= 1 -- items per step"),
    (dict(size=True), "size=True: must be an integer >= 1"),
    (dict(size=2.0), "size=2.0: must be an integer >= 1"),
    (dict(share=1.5), r"share=1.5: must be a number in \[0.0, 1.0\]"),
    (dict(mode="c"), "mode='c': must be one of a, b"),
    (dict(cap=1), "cap=1: must be an integer >= 2 or null"),
    (dict(flag=1), "flag=1: must be true or false"),
    (dict(share=float("nan")), r"share=nan: must be a finite number \(a number in \[0.0, 1.0\]\)"),
    (dict(size=4, share=float("inf")), r"share=inf: must be a finite number"),
    (dict(size=10**20), r"size=100000000000000000000: must be at most 2147483647 \(an integer >= 1\)"),
])
def test_check_args_names_the_setting_its_value_and_the_rule(values, line):
    with pytest.raises(ValueError, match=f"^task.{line}"):
        check_args(Knobs, values, prefix="task.")


def test_check_args_accepts_every_value_at_its_bound_and_ignores_undeclared_names():
    check_args(Knobs, dict(size=1, share=0, mode="b", cap=None, flag=True, target_model=object(), self=None))
    assert rule_text(Knobs, "cap") == "an integer >= 2 or null"


def test_rows_show_the_config_value_beside_the_default():
    table = {r[0]: r for r in rows(Knobs, {"size": 6, "mode": "a", "cap": "${oc.env:X}"})}
    assert table["size"][1:] == ("6 (default 4)", "an integer >= 1", "items per step")
    assert table["mode"][1] == "'a'" and table["cap"][1] == "interpolated" and table["flag"][1] == "false"


@pytest.mark.parametrize("schema", list(S.SCHEMAS["decoder"].values()) + list(S.SCHEMAS["task"].values()),
                         ids=lambda s: s.__name__)
def test_every_schema_is_its_declaration_plus_plumbing(schema):
    """Each decoder and task schema subclasses a declaration and restates none of its fields (each is the
    declaration's own Field object); every field it adds is plumbing. So a default or a bound exists once."""
    declared = next((b for b in schema.__mro__[1:] if b.__name__.endswith("Settings")), None)
    assert declared is not None, f"{schema.__name__} is not built on a declared settings class"
    own = {f.name for f in dataclasses.fields(schema)} - {f.name for f in dataclasses.fields(declared)}
    assert own <= {"_target_", "_partial_", "uses_draft", "name"}, own
    for f in dataclasses.fields(declared):
        assert schema.__dataclass_fields__[f.name] is f, f"{schema.__name__} restates {f.name}"
        assert f.metadata.get("help"), f"{declared.__name__}.{f.name} has no meaning written"


def test_a_changed_declaration_reaches_constructor_schema_and_list(monkeypatch):
    """The constructor's default is the declaration's object itself, not a copy of its value."""
    from decoders.speculative import SpeculativeDecoder

    assert inspect.signature(SpeculativeDecoder).parameters["gamma"].default is D.SpeculativeSettings.gamma
    assert S.SpeculativeConfig.gamma is D.SpeculativeSettings.gamma
    out = list_configs(["decoder=tuned/speculative_tuned", "task=humaneval"])
    # columns are padded to the widest entry of the listed config (a tuned draft_window widens the value column)
    assert re.search(r"^  gamma +6 \(default 4\) +an integer >= 1 +draft tokens per step$", out, re.M), out
    assert "stop_style" in out and "one of codex, function" in out


@pytest.mark.parametrize("override,line", [
    ("decoder.ouroboros.stop_confidence=nan", "decoder.ouroboros.stop_confidence=nan: must be a finite number"),
    ("runner.temperature=inf", "runner.temperature=inf: must be a finite number (0 or a number in [0.001, 100.0])"),
    ("decoder.ouroboros.gamma=99999999999999999999", "decoder.ouroboros.gamma=99999999999999999999: must be at most"),
])
def test_nan_and_inf_break_every_numeric_bound(override, line):
    # Before: NaN compared false with every bound, so stop_confidence=nan ran, and temperature=inf passed the
    # precheck and died in the job with a 14-line traceback
    with pytest.raises(ConfigError) as e:
        compose(["model=tiny-random", "decoder=[vanilla,ouroboros]", override])
    assert str(e.value).startswith(line)


def test_task_constructor_refuses_what_the_schema_refuses():
    from tasks.gsm8k import GSM8K

    with pytest.raises(ValueError, match=r"^task\.num_fewshot=9: must be an integer in \[0, 8\]"):
        GSM8K(num_fewshot=9)
    with pytest.raises(ConfigError, match=r"task\.num_fewshot=9: must be an integer in \[0, 8\]"):
        compose(["task=gsm8k", "task.num_fewshot=9"])


@pytest.mark.parametrize("args,line", [
    (["list", "model=tiny-random"], "error: model=tiny-random: settings are listed for decoder, task, runner"),
    (["list", "decoder=nope"], "error: unknown decoder 'nope'. Valid choices for decoder: fixed_tree"),
    (["list", "nope"], "error: unknown config group nope"),
])
def test_run_py_list_refuses_in_one_line(args, line):
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(line) and len(proc.stderr.splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("group", ["decoder", "task", "runner"])
def test_no_hand_written_config_restates_a_declared_default(group):
    # Before: conf/decoder/speculative.yaml said `gamma: 4`; a changed declaration (gamma 5) was then printed
    # as `4 (default 5)` and runs kept 4. The generated tuned/ configs pin their whole setting on purpose.
    import yaml

    for path in sorted((ROOT / "conf" / group).glob("*.yaml")):
        node = yaml.safe_load(path.read_text())
        schema = S.SCHEMAS[group][node["defaults"][0]]
        declared = {f.name: f.default for f in dataclasses.fields(schema)
                    if "help" in f.metadata or f.name in ("_target_", "name")}   # the class: from the registry
        restated = [k for k, v in node.items() if k in declared and v == declared[k]]
        assert not restated, f"conf/{group}/{path.name} restates the declared default of {restated}"


@pytest.mark.parametrize("overrides,line", [
    (["decoder=[vanilla,opt_tree_cost]", "decoder.opt_tree_cost.cost_aware=-1"],
     "decoder.opt_tree_cost.cost_aware=-1: must be true or false"),
    (["runner.score=2147483648"], "runner.score=2147483648: must be true or false"),
    (["runner.score='5'"], "runner.score='5': must be true or false"),
    (["runner.resume=0"], "runner.resume=0: must be true or false"),
    (["model.chat_template=2"], "model.chat_template=2: must be true or false"),
])
def test_a_boolean_setting_takes_only_true_or_false(overrides, line):
    # Before: the schema turned any integer (and '5') into true, so cost_aware=-1 ran cost-aware
    with pytest.raises(ConfigError) as e:
        compose(["model=tiny-random", *overrides])
    assert str(e.value) == line


def test_a_boolean_setting_of_an_inline_decoder_or_a_constructor_takes_only_true_or_false():
    from harness.config.compose import validate
    from harness.job.run_settings import RunSettings

    cfg = compose(["model=tiny-random", "decoder=[vanilla,opt_tree]"])
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["decoder"]["inline_tree"] = {**plain["decoder"]["opt_tree"], "draft_on_copy": 7}  # an experiment's node
    with pytest.raises(ConfigError, match=r"^decoder\.inline_tree\.draft_on_copy=7: must be true or false$"):
        validate(plain)
    with pytest.raises(ValueError, match=r"^cost_aware=-1: must be true or false"):
        check_args(D.OptTreeSettings, {"cost_aware": -1})
    with pytest.raises(ValueError, match=r"^runner\.score=2: must be true or false"):
        RunSettings(score=2)
    assert compose(["model=tiny-random", "runner.score=false"]).runner.score is False


@pytest.mark.parametrize("value,line", [
    ("1e23", "runner.temperature=1e+23: must be 0 or a number in [0.001, 100.0]"),
    ("1e-400", "runner.temperature=1e-400: underflows to 0 in floating point"),
    ("0.0000001", "runner.temperature=1e-07: must be 0 or a number in [0.001, 100.0]"),
    ("-0.5", "runner.temperature=-0.5: must be 0 or a number in [0.001, 100.0]"),
])
def test_temperature_is_zero_or_a_sensible_positive_number(value, line):
    # Before: 1e23 was accepted, and 1e-400 underflowed to 0.0 and decoded greedily without a word
    with pytest.raises(ConfigError) as e:
        compose(["model=tiny-random", "decoder=[vanilla,speculative]", f"runner.temperature={value}"])
    assert str(e.value).startswith(line)


def test_temperature_bounds_hold_for_the_runner_constructor_and_leave_usual_values_alone():
    from harness.job.run_settings import RunSettings

    with pytest.raises(ValueError, match=r"runner\.temperature=1e\+23: must be 0 or a number in"):
        RunSettings(temperature=1e23)
    for t in ("0", "0.001", "0.7", "100"):
        assert compose(["model=tiny-random", "decoder=[vanilla,speculative]", f"runner.temperature={t}"])


def test_a_float_that_underflows_is_refused_for_every_setting():
    with pytest.raises(ConfigError, match=r"^decoder\.ouroboros\.stop_confidence=1e-999: underflows to 0"):
        compose(["model=tiny-random", "decoder=[vanilla,ouroboros]", "decoder.ouroboros.stop_confidence=1e-999"])
    assert compose(["model=tiny-random", "decoder=[vanilla,ouroboros]", "decoder.ouroboros.stop_confidence=0e5"])


def test_opt_tree_threshold_is_bounded_by_what_a_layer_can_add():
    # A layer's nodes are distinct paths: their values sum to at most 1, so a threshold above 1 stops every tree
    # after its first layer whatever its value; before, any threshold >= 0 was accepted
    with pytest.raises(ConfigError, match=r"decoder\.opt_tree\.threshold=2\.0: must be a number in \[0\.0, 1\.0\]"):
        compose(["model=tiny-random", "decoder=[vanilla,opt_tree]", "decoder.opt_tree.threshold=2"])


def test_an_overridden_tuned_setting_is_marked_in_the_name_and_warned_once(capsys):
    from harness.config import compose as C

    getattr(C, "_WARNED", set()).clear()
    base = ["model=tiny-random", "decoder=[vanilla,tuned/speculative_tuned]"]
    tuned = OmegaConf.load(C.CONF_DIR / "decoder" / "tuned" / "speculative_tuned.yaml").gamma
    assert list(C.validate(compose(base)).decoder) == ["vanilla", "speculative_tuned"]
    assert list(C.validate(compose([*base, f"decoder.speculative_tuned.gamma={tuned}"])).decoder) == \
        ["vanilla", "speculative_tuned"]  # the tuned value itself: still the tuned configuration
    assert capsys.readouterr().err == ""
    other = tuned % 7 + 1
    for _ in range(2):
        decoders = C.validate(compose([*base, f"decoder.speculative_tuned.gamma={other}"])).decoder
    # Before: the rows kept the name speculative_tuned with no warning
    assert list(decoders) == ["vanilla", "speculative_tuned*"]
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: decoder speculative_tuned: gamma={other} (tuned: {tuned}) overrides its tuned setting "
                   "(conf/decoder/tuned/speculative_tuned.yaml), so its rows are labelled speculative_tuned*: not the "
                   "tuned configuration"]
    notes = C.tuning_mismatches(OmegaConf.to_container(decoders), "float32", "none")
    assert any(n.startswith("decoder speculative_tuned: gamma=") for n in notes)


def test_a_class_line_names_a_settings_dataclass_and_the_class_writes_no_constructor(target, noisy_draft):
    """The constructor a DraftingDecoder or Task gets from its declared settings: misuse is one TypeError that says
    what to write (keyword-only settings, a settings dataclass in the class line, no hand-written __init__)."""
    from decoders.common.base import DraftingDecoder
    from decoders.prompt_lookup import PromptLookupDecoder
    from decoders.speculative import SpeculativeDecoder
    from tasks.base import Task
    from tasks.humaneval import HumanEval

    with pytest.raises(TypeError, match=r"positionally, its settings by keyword \(gamma, draft_window\)"):
        SpeculativeDecoder(target, noisy_draft, 3)
    with pytest.raises(TypeError, match="unexpected argument draft_model"):
        PromptLookupDecoder(target, draft_model=noisy_draft)
    with pytest.raises(TypeError, match="takes its settings by keyword"):
        HumanEval("HumanEval.jsonl")
    with pytest.raises(TypeError, match="unknown class keyword; DraftingDecoder takes settings= and uses_draft="):
        type("Misspelt", (DraftingDecoder,), {}, setting=D.SpeculativeSettings)
    with pytest.raises(TypeError, match="unknown class keyword; Task takes settings="):
        type("MisspeltTask", (Task,), {}, setting=D.SpeculativeSettings)
    with pytest.raises(TypeError, match="must be a dataclass of declare.setting fields"):
        type("NotDeclared", (DraftingDecoder,), {}, settings=int)
    with pytest.raises(TypeError, match=r"writes an __init__.*_build\(\)"):
        type("OwnInit", (SpeculativeDecoder,), {"__init__": lambda self, target_model: None})
    with pytest.raises(TypeError, match="names no settings in its class line"):
        type("Bare", (DraftingDecoder,), {})(target, noisy_draft)
    child = type("Child", (SpeculativeDecoder,), {})   # inherits settings, signature and checks
    assert list(inspect.signature(child).parameters) == list(inspect.signature(SpeculativeDecoder).parameters)
