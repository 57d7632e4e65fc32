"""The experiment presets and the tuning step (benchmarks/tune.py: :mod:`harness.protocols.tune`).

* Every ``conf/experiment`` preset composes with Hydra and passes the schema validation that ``run.py`` runs
  before anything (``harness.config.precheck.precheck``: every sweep value of ``hydra.sweeper.params``), without loading a
  model or reading task data. The held-out races select ``*_tuned`` decoder configs that only the tuning step
  writes: they are checked against a copy of ``conf/`` holding configs written by ``tune.py`` itself.
* ``tune.py``'s selection on synthetic tuning runs with known speedups: the best equal-to-vanilla point wins, a
  point whose outputs differ from vanilla is refused, held-out rows are refused, the written config composes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class
from omegaconf import OmegaConf

import harness.job.app
import harness.config.precheck
import harness.config.compose
import harness.config.tuned
from harness.config.precheck import check_choices, missing_decoder_configs, precheck
from harness.config.compose import ConfigError
from harness.protocols import tune, tune_select
from tests.fixture_rows import _row, write_run

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
HELD_OUT = ["race_heldout_humaneval", "race_heldout_mbpp", "race_heldout_gsm8k", "sampled_heldout_humaneval"]
TUNE = ["tune_all", "tune_all_mbpp", "tune_speculative", "tune_lookahead", "tune_prompt_lookup",
        "tune_hf_assisted", "tune_ouroboros", "tune_trees"]
#: Presets measured at tune_all's 128 tokens (tune_all_mbpp: the protocol's second dev task; tune_trees: the tree
#: points of tune_all, to add to its run).
TUNE_128 = ("tune_all", "tune_all_mbpp", "tune_trees")

@pytest.fixture
def nothing_may_load(monkeypatch):
    """Any model load or task data read fails the test."""
    def boom(*a, **k):
        raise AssertionError("a model or task data was loaded by a config check")
    import harness.job.models
    import tasks.humaneval
    import tasks.mbpp

    for mod, name in [(harness.job.app, "load_pair"), (harness.job.models, "load_pair"), (harness.job.models, "load_model"),
                      (harness.job.models, "materialize"), (tasks.humaneval, "HumanEvalTask"), (tasks.mbpp, "MBPPTask")]:
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, boom)


@pytest.fixture(autouse=True)
def _clear_hydra():
    GlobalHydra.instance().clear()
    yield
    GlobalHydra.instance().clear()


def _sweeper_params(name: str, conf: Path = CONF) -> dict:
    node = OmegaConf.load(conf / "experiment" / f"{name}.yaml")
    return OmegaConf.to_container(node.hydra.sweeper.params)


def test_every_protocol_preset_exists():
    assert set(HELD_OUT + TUNE) <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n not in HELD_OUT])
def test_preset_composes_and_validates(name, nothing_may_load):
    """What run.py checks before Hydra starts, for every preset that needs no generated config."""
    assert missing_decoder_configs(name) == []
    precheck([f"experiment={name}"])


@pytest.mark.parametrize("name", TUNE)
def test_tuning_presets_run_on_the_dev_split(name):
    params = _sweeper_params(name)
    assert params["task.offset"] == 0 and params["task.limit"] <= 20        # HumanEval 0-19 / MBPP's first dev ids
    assert params["runner.order"] == "rotate"
    # the protocol's one-sitting tuning run measures 128 tokens; the finer family sweeps the race's 256
    assert params["runner.max_new_tokens"] == (128 if name in TUNE_128 else 256)
    cfg = harness.config.compose.compose([f"experiment={name}"], return_hydra_config=True)
    assert OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["dir"] == \
        "results/tuning/${hydra.runtime.choices.experiment}"                # one fixed folder: re-run = resume
    if "mbpp" in name:
        assert cfg.hydra.runtime.choices.task == "mbpp" and params["task.split"] == "validation"
    else:
        assert cfg.hydra.runtime.choices.task == "humaneval"
    assert cfg.model.dtype == "auto"
    decoders = list(cfg.decoder)
    assert decoders[0] == "vanilla" and len(decoders) >= 3
    family = {"tune_trees": "opt_tree"}.get(name, name.removeprefix("tune_"))
    if family not in ("all", "all_mbpp"):
        assert all(family in tune_select.FAMILIES_OF_TARGET[cfg.decoder[d]._target_] for d in decoders[1:])
    else:
        covered = {f for d in decoders[1:] for f in tune_select.FAMILIES_OF_TARGET[cfg.decoder[d]._target_]}
        assert covered == set(tune_select.FAMILIES)
        assert all(cfg.decoder[d].get("pool_scope", "sample") == "sample" for d in decoders)   # cold only


def test_hf_assisted_tuning_includes_threshold_off():
    cfg = harness.config.compose.compose(["experiment=tune_hf_assisted"])
    thresholds = {cfg.decoder[d].get("assistant_confidence_threshold") for d in cfg.decoder if d != "vanilla"}
    assert 0.0 in thresholds and 0.4 in thresholds and None in thresholds


def _conf_without_tuned(tmp_path):
    """A copy of conf/ without the committed *_tuned configs: a checkout before the tuning step."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    for tuned in (conf / "decoder" / "tuned").glob("*_tuned.yaml"):
        tuned.unlink()
    return conf


def _use_conf(conf, monkeypatch):
    """Point composition and the launch checks at the config tree ``conf`` (a copy of conf/)."""
    monkeypatch.setattr(harness.config.precheck, "CONF_DIR", conf)
    monkeypatch.setattr(harness.config.compose, "CONF_DIR", conf)
    monkeypatch.setattr(harness.config.tuned, "CONF_DIR", conf)
    monkeypatch.setattr(harness.config.compose.compose, "__kwdefaults__",
                        {**harness.config.compose.compose.__kwdefaults__, "config_dir": conf})


def test_held_out_presets_refused_before_tuning_naming_the_missing_configs(tmp_path, monkeypatch, nothing_may_load):
    """On a checkout without *_tuned configs (here: a copy of conf/ with them removed, since the repository
    commits a set), the races are refused before anything loads, naming the missing configs and the tuning step."""
    _use_conf(_conf_without_tuned(tmp_path), monkeypatch)
    for name in HELD_OUT:
        missing = missing_decoder_configs(name)
        assert missing and all(m.startswith("tuned/") and m.endswith("_tuned") for m in missing)
        with pytest.raises(ConfigError, match=r"speculative_tuned.*do not exist yet.*benchmarks/tune.py"):
            check_choices([f"experiment={name}"])
    check_choices(["experiment=race_heldout_mbpp", "decoder=[vanilla]"])   # the command line replaces the list


@pytest.mark.parametrize("name,task,offset,limit,repeats", [
    ("race_heldout_humaneval", "humaneval", 20, 13, 1),
    ("race_heldout_mbpp", "mbpp", 0, 10, 1),
    ("race_heldout_gsm8k", "gsm8k", 0, 3, 1),
    ("sampled_heldout_humaneval", "humaneval", 20, 10, 1),
])
def test_held_out_presets_validate_with_tuned_configs(name, task, offset, limit, repeats, tmp_path, monkeypatch,
                                                      nothing_may_load):
    """The races compose and validate (every sweep value) once tune.py has written the *_tuned configs: here
    into a copy of conf/, from synthetic tuning runs."""
    conf = _conf_without_tuned(tmp_path)
    runs = _tuning_runs(tmp_path / "runs", all_families=True)
    assert tune.main([str(r) for r in runs] + ["--conf-dir", str(conf / "decoder" / "tuned"), "--combine", "task"]) == 0
    _use_conf(conf, monkeypatch)
    assert missing_decoder_configs(name) == []
    precheck([f"experiment={name}"])
    params = _sweeper_params(name, conf)
    assert (params["task.offset"], params["task.limit"], params["runner.repeats"]) == (offset, limit, repeats)
    assert params["runner.order"] == "rotate" and params["runner.max_new_tokens"] == 256
    GlobalHydra.instance().clear()
    cfg = harness.config.compose.compose([f"experiment={name}"], return_hydra_config=True)
    assert cfg.hydra.runtime.choices.task == task and cfg.model.dtype == "auto"
    decoders = list(cfg.decoder)
    assert decoders[0] == "vanilla"
    if name.startswith("sampled"):
        assert params["runner.temperature"] == 0.7
        GlobalHydra.instance().clear()
        race = harness.config.compose.compose(["experiment=race_heldout_humaneval"])
        samplers = [d for d in race.decoder if getattr(get_class(race.decoder[d]._target_), "supports_sampling", False)]
        assert samplers == decoders          # every decoder of the race that can sample, and only those
    else:
        assert {"speculative_tuned", "lookahead_tuned", "prompt_lookup_tuned", "hf_assisted_tuned",
                "ouroboros_tuned", "ouroboros_best_tuned", "opt_tree_tuned", "opt_tree_best_tuned"} <= set(decoders)
    assert "hf_greedy" in decoders             # transformers' own generate: our vanilla is not handicapped
    if task == "mbpp":
        assert params["task.split"] == "test"


# ------------------------------------------------------------------------------------------- tune.py selection
TARGETS = {"speculative": ("decoders.speculative.SpeculativeDecoder", True),
           "prompt_lookup": ("decoders.prompt_lookup.PromptLookupDecoder", False),
           "lookahead": ("decoders.lookahead.LookaheadDecoder", False),
           "hf_assisted": ("decoders.hf_assisted.HFAssistedDecoder", True),
           "ouroboros": ("decoders.ouroboros.OuroborosDecoder", True),
           "opt_tree": ("decoders.opt_tree.OptTreeDecoder", True)}
TREE = dict(threshold=0.5, max_depth=10, cost_aware=False, copy_tokens=0, draft_on_copy=True)
OURO = dict(window_size=4, ngram_size=4, guess_set_size=4, topk=3, pool_scope="sample", seed=0, pool_from_prompt=False,
            free_draft_min_match=0, draft_vocab_size=0, stop_confidence=0.0, branch_confidence=0.0, max_branches=1)
#: name -> (family, params, speedup factor, samples that diverge from vanilla)
GRID = {
    "speculative_g4": ("speculative", {"gamma": 4}, 1.6, ()),
    "speculative_g6": ("speculative", {"gamma": 6}, 1.8, ()),
    "speculative_g8": ("speculative", {"gamma": 8}, 2.5, (1,)),      # fastest, but its output differs
    "prompt_lookup_n3d10": ("prompt_lookup", {"max_ngram_size": 3, "num_draft_tokens": 10, "min_ngram_size": 1}, 2.0, ()),
    "prompt_lookup_n3d20": ("prompt_lookup", {"max_ngram_size": 3, "num_draft_tokens": 20, "min_ngram_size": 1}, 2.2, ()),
}
GRID_MORE = {
    "lookahead_w8n3g8": ("lookahead", {"window_size": 8, "ngram_size": 3, "guess_set_size": 8, "pool_scope": "sample",
                                       "seed": 0, "pool_from_prompt": False}, 1.3, ()),
    "hf_assisted_g6_constant_off": ("hf_assisted", {"gamma": 6, "num_assistant_tokens_schedule": "constant",
                                                    "assistant_confidence_threshold": 0.0}, 1.7, ()),
    "ouroboros_g6": ("ouroboros", {"gamma": 6, **OURO}, 1.9, ()),
    "ouroboros_g6_prompt": ("ouroboros", {"gamma": 6, **{**OURO, "pool_from_prompt": True}}, 2.4, ()),
    "opt_tree_n32": ("opt_tree", {"num_nodes": 32, **TREE}, 2.2, ()),
    "opt_tree_n32_w128": ("opt_tree", {"num_nodes": 32, **{**TREE, "draft_window": 128}}, 2.4, ()),
    "opt_tree_hybrid_n32": ("opt_tree", {"num_nodes": 32, **{**TREE, "copy_tokens": 20, "draft_on_copy": False}},
                            2.9, ()),
}


def _tuning_runs(root: Path, grid: dict | None = None, all_families: bool = False, dtype: str = "bfloat16",
                 humaneval_ids=range(0, 4), mbpp_ids=range(511, 515)) -> list[Path]:
    """One run folder per dev task, as run.py writes them (results.jsonl + meta.json), with known speedups."""
    grid = dict(grid or GRID)
    if all_families:
        grid.update(GRID_MORE)
    runs = []
    for task, ids in (("humaneval", humaneval_ids), ("mbpp", mbpp_ids)):
        run = root / task
        rows, config = [], {"vanilla": {"_target_": "decoders.vanilla.VanillaDecoder", "_partial_": True,
                                        "uses_draft": False}}
        for i in ids:
            n, v_tps = 40, 5.0 + i % 3
            rows.append(_row("r1", task, i, "vanilla", {}, new_tokens=n, num_steps=n, accept_length=1.0,
                             wall_time_s=n / v_tps, tokens_per_s=v_tps, matches_vanilla=True, completion="x"))
            for name, (family, params, factor, divergent) in grid.items():
                bad = (i - ids[0]) in divergent
                rows.append(_row("r1", task, i, name, params, new_tokens=n, num_steps=n // 3, accept_length=3.0,
                                 wall_time_s=n / (v_tps * factor), tokens_per_s=v_tps * factor,
                                 matches_vanilla=not bad, first_divergence=5 if bad else None, completion="x"))
        for name, (family, params, _, _) in grid.items():
            target, draft = TARGETS[family]
            config[name] = {"_target_": target, "_partial_": True, "uses_draft": draft, **params}
        for r in rows:
            r["dtype"] = dtype
        write_run(run, rows)
        (run / "meta.json").write_text(json.dumps({"config": {"decoder": config}}))
        runs.append(run)
    return runs


def test_tune_picks_the_fastest_equal_point_and_refuses_the_divergent_one(tmp_path, capsys):
    runs = _tuning_runs(tmp_path)
    out = tmp_path / "decoder"
    status = tune.main([str(r) for r in runs] + ["--conf-dir", str(out), "--combine", "task", "--family", "speculative",
                                                 "--family", "prompt_lookup"])
    text = capsys.readouterr().out
    assert status == 0, text
    spec = yaml.safe_load((out / "speculative_tuned.yaml").read_text())
    assert spec["gamma"] == 6                                     # g8 is faster (2.5x) but differs from vanilla
    assert "speculative_g8: output differs from vanilla in bfloat16" in text
    assert yaml.safe_load((out / "prompt_lookup_tuned.yaml").read_text())["num_draft_tokens"] == 20
    header = (out / "speculative_tuned.yaml").read_text()
    assert "grid point speculative_g6" in header and "speedup_total" in header and "required" in header
    assert str(runs[0]) in header and "humaneval/0-3" in header
    assert "Score 1.800" in header                                   # total tokens / total time ratio, both tasks


def test_tune_allow_half_divergence_admits_the_divergent_point(tmp_path, capsys):
    out = tmp_path / "decoder"
    status = tune.main([str(r) for r in _tuning_runs(tmp_path)] + ["--conf-dir", str(out), "--combine", "task",
                                                                   "--family", "speculative",
                                                                   "--allow-half-divergence"])
    assert status == 0
    text = (out / "speculative_tuned.yaml").read_text()
    assert yaml.safe_load(text)["gamma"] == 8 and "NOT required" in text


def test_tune_refuses_a_family_whose_every_point_differs(tmp_path, capsys):
    grid = {k: (f, p, s, (0,)) for k, (f, p, s, _) in GRID.items() if f == "speculative"}
    out = tmp_path / "decoder"
    status = tune.main([str(r) for r in _tuning_runs(tmp_path, grid)] + ["--conf-dir", str(out), "--combine", "task"])
    assert status == 1
    assert not (out / "speculative_tuned.yaml").exists()
    assert "speculative: REFUSED" in capsys.readouterr().out


def test_tune_refuses_a_float32_divergence_for_the_whole_family(tmp_path, capsys):
    out = tmp_path / "decoder"
    status = tune.main([str(r) for r in _tuning_runs(tmp_path, dtype="float32")] + ["--conf-dir", str(out),
                                                                                    "--combine", "task",
                                                                                    "--family", "speculative"])
    assert status == 1 and not (out / "speculative_tuned.yaml").exists()
    assert "differs from vanilla in float32" in capsys.readouterr().out


@pytest.mark.parametrize("ids,task_line", [
    ({"humaneval_ids": range(18, 22)}, "humaneval rows include held-out samples (humaneval/20-21)"),
    ({"mbpp_ids": range(11, 15)}, "mbpp rows include held-out samples (mbpp/11-14)"),
])
def test_tune_refuses_runs_not_on_the_dev_split(ids, task_line, tmp_path, capsys):
    out = tmp_path / "decoder"
    status = tune.main([str(r) for r in _tuning_runs(tmp_path, **ids)] + ["--conf-dir", str(out)])
    assert status == 2
    assert task_line in capsys.readouterr().err
    assert not out.exists()


def test_tune_refuses_a_task_without_a_dev_split(tmp_path, capsys):
    runs = _tuning_runs(tmp_path)
    rows = [json.loads(line) for line in (runs[1] / "results.jsonl").read_text().splitlines()]
    for r in rows:
        r["task"] = "gsm8k"
        r["sample_id"] = r["sample_id"].replace("mbpp", "gsm8k")
    (runs[1] / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert tune.main([str(r) for r in runs] + ["--conf-dir", str(tmp_path / "d")]) == 2
    assert "task gsm8k has no dev split" in capsys.readouterr().err


def test_paper_faithful_ouroboros_excludes_extensions(tmp_path, capsys):
    out = tmp_path / "decoder"
    status = tune.main([str(r) for r in _tuning_runs(tmp_path, all_families=True)]
                       + ["--conf-dir", str(out), "--combine", "task", "--family", "ouroboros",
                          "--family", "ouroboros_best"])
    assert status == 0, capsys.readouterr()
    assert yaml.safe_load((out / "ouroboros_tuned.yaml").read_text())["pool_from_prompt"] is False
    assert yaml.safe_load((out / "ouroboros_best_tuned.yaml").read_text())["pool_from_prompt"] is True


def test_tune_opt_tree_families_split_paper_faithful_from_extensions(tmp_path, capsys):
    """opt_tree takes only paper-faithful points (neither cost-aware nor hybrid nor a draft window, though the
    windowed point is faster); opt_tree_best takes any."""
    out = tmp_path / "decoder"
    runs = _tuning_runs(tmp_path, all_families=True)
    status = tune.main([str(r) for r in runs] + ["--conf-dir", str(out), "--combine", "task", "--family", "opt_tree",
                                                 "--family", "opt_tree_best"])
    assert status == 0, capsys.readouterr().out
    paper = yaml.safe_load((out / "opt_tree_tuned.yaml").read_text())
    best = yaml.safe_load((out / "opt_tree_best_tuned.yaml").read_text())
    assert paper["num_nodes"] == 32 and paper.get("copy_tokens", 0) == 0 and paper.get("draft_window", 0) == 0
    assert best["copy_tokens"] == 20 and best["draft_on_copy"] is False
