"""Losslessness by construction: every config file in ``conf/decoder/`` is built the way a run builds it
(composed by Hydra as ``decoder=[<name>]``, then :func:`harness.job.app.build_decoder`: ``hydra.utils.instantiate``
on the config and the factory called with the models, EOS ids and tokenizer)
and must reproduce vanilla greedy's whole sequence in float32 on the tiny random models.

The configs are discovered by glob, so a new decoder config is tested the moment it exists; there is no
list to forget to extend. Decoders that use a draft get ``noisy_draft`` (the target with small weight
noise: drafts accepted often but not always, so both accept and reject paths run). Prompts include
repetitive ones, so n-gram pools and prompt lookup actually hit. A decoder with a task-scoped pool
(``pool_scope: task``) keeps its pool across the prompts, as in a run.
"""

from __future__ import annotations

from pathlib import Path
import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import PROMPTS
from decoders.vanilla import VanillaDecoder
from harness.job.app import CONF_DIR, build_decoder, decoder_configs

CONFIGS = sorted((CONF_DIR / "decoder").rglob("*.yaml"))  # the hand-written and the generated (tuned/) ones
#: Plain text, code, and repetitive prompts (which make pools and prompt lookup hit).
CHOSEN = [PROMPTS[i] for i in (0, 2, 3, 4, 5, 8, 9, 11)]
MAX_NEW_TOKENS = 40


def test_every_decoder_config_is_collected():
    assert len(CONFIGS) >= 12 and all(p.suffix == ".yaml" for p in CONFIGS)
    assert {"vanilla", "speculative", "hf_assisted", "lookahead", "ouroboros", "prompt_lookup"} <= {
        p.stem for p in CONFIGS}


@pytest.fixture(scope="module")
def references(target, tokenizer, eos_ids):
    """Vanilla greedy's whole sequence for every chosen prompt."""
    vanilla = VanillaDecoder(target_model=target, eos_token_ids=eos_ids)
    out = []
    for p in CHOSEN:
        ids = torch.tensor([tokenizer(p, add_special_tokens=False).input_ids])
        out.append((ids, vanilla.generate(ids, MAX_NEW_TOKENS).token_ids))
    return out


#: Configs that decode one token per forward by design (references), so "never drafted" is expected.
NON_DRAFTING = {"vanilla", "hf_greedy"}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_config_reproduces_vanilla_in_float32(config: Path, target, noisy_draft, tokenizer, eos_ids, references):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        selected = config.relative_to(CONF_DIR / "decoder").with_suffix("").as_posix()
        cfg = compose("config", overrides=["model=tiny-random", f"decoder=[{selected}]"])
    dcfg = decoder_configs(cfg)[config.stem]
    supplied = {"target_model": target, "draft_model": noisy_draft if dcfg.get("uses_draft") else None,
                "eos_token_ids": eos_ids, "tokenizer": tokenizer}
    decoder = build_decoder(dcfg, supplied)
    assert target.dtype == torch.float32
    drafted = 0
    for ids, expected in references:
        result = decoder.generate(ids, MAX_NEW_TOKENS)
        assert tuple(result.token_ids) == tuple(expected), f"{config.stem} differs from vanilla on {ids.tolist()}"
        assert result.new_tokens == len(expected)
        drafted += result.num_drafted
    if config.stem not in NON_DRAFTING:
        assert drafted > 0, f"{config.stem} never drafted: the test would not exercise verification"
