"""Every config file composes, and every decoder config instantiates on tiny models."""

from pathlib import Path

import hydra
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.app import check_choices

CONF = Path(__file__).resolve().parent.parent / "conf"


def _names(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_main_job_config():
    cfg = _compose([])
    assert cfg.model.name == "qwen2.5-coder-1.5b"
    assert cfg.model.dtype == "bfloat16"
    assert cfg.task.name == "humaneval" and cfg.task.limit == 5
    assert cfg.runner.max_new_tokens == 128
    assert list(cfg.decoder) == ["vanilla", "speculative", "hf_assisted"]


@pytest.mark.parametrize("model", _names("model"))
def test_model_configs_compose(model):
    cfg = _compose([f"model={model}"])
    assert cfg.model.target.source
    assert cfg.model.dtype in ("bfloat16", "float16", "float32")


@pytest.mark.parametrize("task", _names("task"))
def test_task_configs_compose(task):
    cfg = _compose([f"task={task}"])
    assert cfg.task._target_.startswith("tasks.")


@pytest.mark.parametrize("decoder", _names("decoder"))
def test_decoder_configs_instantiate(decoder, target, noisy_draft, eos_ids, tokenizer):
    cfg = _compose([f"decoder=[{decoder}]"])
    node = OmegaConf.to_container(cfg.decoder[decoder], resolve=True)
    dec = hydra.utils.instantiate(node)(target_model=target, draft_model=noisy_draft, eos_token_ids=eos_ids,
                                        tokenizer=tokenizer)
    assert hasattr(dec, "generate")


def test_decoder_hyperparameters_are_overridable():
    cfg = _compose(["decoder=[vanilla,speculative]", "decoder.speculative.gamma=6"])
    assert cfg.decoder.speculative.gamma == 6


def test_misspelt_key_is_refused():
    with pytest.raises(Exception, match="runner.max_new_token"):
        _compose(["runner.max_new_token=3"])


@pytest.mark.parametrize("arg,group", [("model=nope", "model"), ("decoder=[vanilla,nope]", "decoder"),
                                       ("task=nope", "task")])
def test_unknown_names_list_choices(arg, group):
    with pytest.raises(SystemExit) as e:
        check_choices([arg])
    assert f"Valid choices for {group}" in str(e.value)
    for name in _names(group):
        assert name in str(e.value)
