"""Adding a decoder, as README's "Extending" says, with nothing else in the repository changed.

An example decoder (greedy decoding, its loop written out, with one setting) is written as a module of its
own under ``tmp_path``; its settings are declared there and it is registered in one line through the public
registry function (:func:`decoders.settings.register_decoder`); its config is one YAML in a copy of ``conf/``.
It then composes, passes the checks of the command line, is listed with its settings, builds, decodes on the
tiny random models and gives exactly vanilla's tokens; and its name appears in no file of the repository but
this one, so the registry line is the only place the harness learns of it.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import declare
import harness.config.compose
import harness.config.precheck
import harness.config.tuned
from decoders.settings import VanillaSettings, register_decoder
from decoders.vanilla import VanillaDecoder
from harness.config import schemas as S
from harness.config.compose import ConfigError, compose
from harness.config.precheck import list_configs, precheck
from harness.job.app import build_decoder

ROOT = Path(__file__).resolve().parents[1]
NAME = "greedy_loop"
MODULE = "greedy_loop_example"

#: The new decoder's module: its declared settings and its class (a decoder needs nothing else).
DECODER_MODULE = '''
    """Greedy decoding, its loop written out: the example of tests/test_extending.py."""

    from dataclasses import dataclass

    import torch

    from declare import at_least, check_args, setting
    from decoders.common.forward import forward, new_cache
    from decoders.common.stopping import truncate_at_stop
    from decoders.types import DecodeResult, StepRecord


    @dataclass
    class GreedyLoopSettings:
        """Greedy decoding with a KV cache and a cap on target forwards."""

        max_steps: int = setting(100000, at_least(1), "most target forwards per call")


    class GreedyLoopDecoder:
        name = "greedy_loop"

        def __init__(self, target_model, eos_token_ids=(), max_steps: int = GreedyLoopSettings.max_steps):
            check_args(GreedyLoopSettings, locals())
            self.target_model, self.eos_token_ids, self.max_steps = target_model, frozenset(eos_token_ids), max_steps

        @torch.inference_mode()
        def generate(self, input_ids, max_new_tokens, generator=None, stopwatch=None):
            cache = new_cache(self.target_model)
            token = forward(self.target_model, input_ids, cache, logits_to_keep=1)[:, -1:].argmax(-1)
            out, steps = [int(token)], [StepRecord(target_tokens_fed=input_ids.shape[1], emitted=1)]
            while len(out) < max_new_tokens and out[-1] not in self.eos_token_ids and len(steps) < self.max_steps:
                token = forward(self.target_model, token, cache, logits_to_keep=1)[:, -1:].argmax(-1)
                out.append(int(token))
                steps.append(StepRecord(target_tokens_fed=1, emitted=1))
            return DecodeResult(tuple(truncate_at_stop(out, self.eos_token_ids, max_new_tokens)), tuple(steps))
'''

#: Its config: the schema the registry line generated, and a value of its own.
DECODER_YAML = f"""\
# @package decoder.{NAME}
# Greedy decoding, its loop written out (tests/test_extending.py).
defaults:
  - base_decoder_{NAME}
  - _self_
max_steps: 64
"""


@pytest.fixture
def new_decoder(tmp_path, monkeypatch):
    """The example decoder written, registered and configured in a copy of conf/; unregistered afterwards."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(DECODER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(MODULE)
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "decoder" / f"{NAME}.yaml").write_text(DECODER_YAML)
    for where in (harness.config.precheck, harness.config.tuned):  # the command-line checks read this tree
        monkeypatch.setattr(where, "CONF_DIR", conf)
    monkeypatch.setattr(harness.config.compose.compose, "__kwdefaults__",
                        {**harness.config.compose.compose.__kwdefaults__, "config_dir": conf})
    GlobalHydra.instance().clear()

    register_decoder(NAME, f"{MODULE}.GreedyLoopDecoder", module.GreedyLoopSettings)   # the one line

    yield module
    declare.unregister("decoder", NAME)
    GlobalHydra.instance().clear()


def test_a_registered_decoder_composes_checks_builds_and_equals_vanilla(new_decoder, target, eos_ids, prompt_ids,
                                                                       tmp_path):
    schema = S.SCHEMAS["decoder"][f"base_decoder_{NAME}"]
    assert S.DECODER_SCHEMAS[f"{MODULE}.GreedyLoopDecoder"] is schema is S.GreedyLoopConfig
    assert schema.__dataclass_fields__["max_steps"] is new_decoder.GreedyLoopSettings.__dataclass_fields__["max_steps"]

    cfg = compose(["model=tiny-random", f"decoder=[vanilla,{NAME}]"])
    node = cfg.decoder[NAME]
    assert OmegaConf.get_type(node) is schema
    assert OmegaConf.to_container(node) == {"_target_": f"{MODULE}.GreedyLoopDecoder", "_partial_": True,
                                            "uses_draft": False, "max_steps": 64}
    with pytest.raises(ConfigError, match=rf"^decoder\.{NAME}\.max_steps=0: must be an integer >= 1$"):
        compose(["model=tiny-random", f"decoder=[vanilla,{NAME}]", f"decoder.{NAME}.max_steps=0"])
    with pytest.raises(ConfigError, match=rf"unknown key decoder\.{NAME}\.max_step\b.*takes max_steps"):
        compose(["model=tiny-random", f"decoder=[vanilla,{NAME}]", f"decoder.{NAME}.max_step=3"])

    folder = precheck(["model=tiny-random", f"decoder=[vanilla,{NAME}]", f"hydra.run.dir={tmp_path / 'run'}"])
    assert folder is not None and folder.path == tmp_path / "run" and not folder.path.exists()
    assert f"max_steps  64 (default 100000)  an integer >= 1  most target forwards per call" in \
        list_configs([f"decoder={NAME}"])

    decoder = build_decoder(OmegaConf.to_container(node), {"target_model": target, "eos_token_ids": eos_ids})
    assert type(decoder).__name__ == "GreedyLoopDecoder" and decoder.max_steps == 64
    vanilla = VanillaDecoder(target, eos_ids)
    for ids in prompt_ids:
        mine = decoder.generate(ids, 16)
        assert mine.token_ids == vanilla.generate(ids, 16).token_ids
        assert mine.num_steps == len(mine.token_ids)


def test_the_registry_line_is_the_only_place_the_harness_learns_of_it():
    """No file of the repository names the example decoder but this test: the harness found its schema, config
    checks, listing and class through the registry alone."""
    mentions = []
    for folder in ("harness", "decoders", "tasks", "declare", "conf", "benchmarks", "plots", "docs", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".yaml", ".md") and path != Path(__file__).resolve():
                text = path.read_text(errors="replace")
                mentions += [str(path.relative_to(ROOT)) for word in (NAME, "GreedyLoop", MODULE) if word in text]
    for path in (ROOT / "README.md", ROOT / "run.py"):
        mentions += [path.name for word in (NAME, "GreedyLoop", MODULE) if word in path.read_text()]
    assert not mentions, f"the example decoder is named outside its test: {sorted(set(mentions))}"
    assert NAME not in declare.REGISTRY["decoder"] and f"base_decoder_{NAME}" not in S.SCHEMAS["decoder"]


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="registered already"):
        register_decoder("speculative", "decoders.vanilla.VanillaDecoder", VanillaSettings)
    assert S.SCHEMAS["decoder"]["base_decoder_speculative"]._target_ == "decoders.speculative.SpeculativeDecoder"
