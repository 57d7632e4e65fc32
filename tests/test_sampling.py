"""Sampling settings in one place: validation, transformers' warpers, seeds, generators, refusal, runner rows.

The distributions themselves are tested in test_sampling_verify.py (the rules) and test_sampling_decoders.py
(every decoder end to end).
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from decoders.common.sampling import (GREEDY, SamplingConfig, argmax_ids, make_generator,
                                      require_sampling_support, sample_seed)
from decoders.hf_assisted import HFAssistedDecoder, HFGreedyDecoder
from decoders.lookahead import LookaheadDecoder
from decoders.ouroboros import OuroborosDecoder
from decoders.prompt_lookup import PromptLookupDecoder
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder
from harness.job.app import ConfigError
from harness.job.run_settings import RunSettings
from tests.tiny_jobs import result_rows, run_tiny_job

SAMPLING = SamplingConfig(temperature=0.9, top_p=0.9, top_k=20)


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
    ({"temperature": 1.0, "top_p": 1.5}, "top_p"),
    ({"temperature": 1.0, "top_k": -1}, "top_k"),
    ({"temperature": 1.0, "top_k": 2.5}, "top_k"),
    ({"temperature": 0.0, "top_p": 0.9}, "only apply when sampling"),
    ({"temperature": 0.0, "top_k": 5}, "only apply when sampling"),
])
def test_bad_settings_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_greedy_is_the_default():
    assert SamplingConfig() == GREEDY and GREEDY.greedy
    assert RunSettings().sampling == GREEDY
    assert GREEDY.generation_config_kwargs() == {"do_sample": False}
    with pytest.raises(ValueError, match="temperature > 0"):
        GREEDY.probs(torch.zeros(4))


def test_runner_settings_validate_sampling():
    assert RunSettings(temperature=1, top_k=3).sampling == SamplingConfig(1.0, 1.0, 3)
    with pytest.raises(ValueError, match=r"runner\.top_p=2\.0: must be a number in \(0\.0, 1\.0\]"):
        RunSettings(temperature=0.7, top_p=2.0)
    with pytest.raises(ValueError, match="runner.seed"):
        RunSettings(seed=-1)


def test_probs_apply_temperature_top_k_top_p():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.0]])
    torch.testing.assert_close(SamplingConfig(2.0).probs(logits), (logits / 2).softmax(-1))
    top2 = SamplingConfig(1.0, top_k=2).probs(logits)[0]
    torch.testing.assert_close(top2, torch.tensor([0, 0, 1, 2.718281828, 0]).div(3.718281828))
    # top_p: keep the smallest set of most likely tokens whose mass reaches top_p.
    full = logits.softmax(-1)[0]  # [.032, .087, .237, .644, .012]
    nucleus = SamplingConfig(1.0, top_p=0.85).probs(logits)[0]
    assert (nucleus > 0).tolist() == [False, False, True, True, False]
    torch.testing.assert_close(nucleus[2:4], full[2:4] / full[2:4].sum())
    # any leading shape, float32 out
    assert SamplingConfig(0.5).probs(torch.zeros(2, 3, 7, dtype=torch.bfloat16)).dtype == torch.float32


def test_same_processing_as_transformers(target):
    """Our processed distribution equals the scores transformers' generate samples from, same config."""
    ids = torch.tensor([[5, 6, 7, 8]])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, output_scores=True,
                          return_dict_in_generate=True, pad_token_id=0,
                          generation_config=GenerationConfig(**SAMPLING.generation_config_kwargs()))
    torch.testing.assert_close(SAMPLING.probs(target(input_ids=ids).logits[0, -1]), out.scores[0][0].softmax(-1))


def test_sample_seed_is_stable_and_paired():
    a = sample_seed(0, "HumanEval/3")
    assert a == sample_seed(0, "HumanEval/3", 0, 0) and 0 <= a < 2**63
    others = {sample_seed(1, "HumanEval/3"), sample_seed(0, "HumanEval/4"), sample_seed(0, "HumanEval/3", turn=1),
              sample_seed(0, "HumanEval/3", repeat=1)}
    assert a not in others and len(others) == 4


def _sampling_decoders(target, noisy_draft, eos_ids, tokenizer, sampling=SAMPLING):
    return {
        "vanilla": VanillaDecoder(target, eos_ids, sampling=sampling),
        "speculative": SpeculativeDecoder(target, noisy_draft, gamma=3, eos_token_ids=eos_ids, sampling=sampling),
        "prompt_lookup": PromptLookupDecoder(target, eos_token_ids=eos_ids, sampling=sampling),
        "hf_assisted": HFAssistedDecoder(target, noisy_draft, gamma=3, eos_token_ids=eos_ids, tokenizer=tokenizer,
                                         sampling=sampling),
        "hf_greedy": HFGreedyDecoder(target, eos_ids, sampling=sampling),
        "lookahead": LookaheadDecoder(target, eos_token_ids=eos_ids, sampling=sampling),
        "ouroboros": OuroborosDecoder(target, noisy_draft, gamma=3, eos_token_ids=eos_ids, sampling=sampling),
    }


@pytest.mark.parametrize("name", ["vanilla", "speculative", "prompt_lookup", "hf_assisted", "hf_greedy",
                                  "lookahead", "ouroboros"])
def test_reproducible_from_the_generator_alone(name, target, noisy_draft, eos_ids, tokenizer, prompt_ids):
    """Same seed -> same tokens, whatever the global RNG; another seed -> other tokens; global RNG untouched."""
    decoder = _sampling_decoders(target, noisy_draft, eos_ids, tokenizer)[name]
    ids = prompt_ids[0]
    torch.manual_seed(123)
    first = decoder.generate(ids, 24, generator=make_generator(7)).token_ids
    torch.manual_seed(999)
    state = torch.get_rng_state()
    again = decoder.generate(ids, 24, generator=make_generator(7)).token_ids
    assert torch.equal(torch.get_rng_state(), state)  # no global draw, nothing left behind
    assert again == first
    others = {decoder.generate(ids, 24, generator=make_generator(s)).token_ids for s in (8, 9, 10)}
    assert others != {first}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["vanilla", "speculative", "prompt_lookup", "hf_assisted", "hf_greedy",
                                  "lookahead", "ouroboros"])
def test_sampling_on_cuda_with_a_cuda_generator(name, target, noisy_draft, eos_ids, tokenizer, prompt_ids):
    """The runner's generator lives on the model's device; every draw (and transformers' forked RNG) works there."""
    import copy

    cuda_target, cuda_draft = copy.deepcopy(target).cuda(), copy.deepcopy(noisy_draft).cuda()
    decoder = _sampling_decoders(cuda_target, cuda_draft, eos_ids, tokenizer)[name]
    ids = prompt_ids[0].cuda()
    first = decoder.generate(ids, 16, generator=make_generator(7, "cuda")).token_ids
    assert decoder.generate(ids, 16, generator=make_generator(7, "cuda")).token_ids == first


@pytest.mark.parametrize("name", ["vanilla", "speculative", "prompt_lookup", "hf_assisted", "hf_greedy",
                                  "lookahead", "ouroboros"])
def test_sampling_without_generator_refused(name, target, noisy_draft, eos_ids, tokenizer, prompt_ids):
    decoder = _sampling_decoders(target, noisy_draft, eos_ids, tokenizer)[name]
    with pytest.raises(ValueError, match="generator"):
        decoder.generate(prompt_ids[0], 4)


def test_sampled_speculative_accepts_drafts(target, noisy_draft, eos_ids, prompt_ids):
    """At temperature 0.9 a close draft still gets most tokens accepted (the rule is not degenerate)."""
    decoder = SpeculativeDecoder(target, noisy_draft, gamma=4, eos_token_ids=eos_ids, sampling=SAMPLING)
    results = [decoder.generate(ids, 32, generator=make_generator(i)) for i, ids in enumerate(prompt_ids)]
    drafted = sum(r.num_drafted for r in results)
    assert 0.5 < sum(r.num_accepted for r in results) / drafted < 1.0
    same = SpeculativeDecoder(target, target, gamma=4, eos_token_ids=eos_ids, sampling=SAMPLING)
    r = same.generate(prompt_ids[0], 21, generator=make_generator(0))  # draft = target: all accepted
    assert r.acceptance_rate == 1.0


class _GreedyOnlyDecoder:
    """A decoder that does not declare ``supports_sampling``."""

    name = "greedy_only"


def test_decoders_that_cannot_sample_are_refused():
    require_sampling_support("x", _GreedyOnlyDecoder, GREEDY)  # greedy: fine
    with pytest.raises(ValueError, match="cannot sample yet.*runner.temperature=0"):
        require_sampling_support("x", _GreedyOnlyDecoder, SAMPLING)
    with pytest.raises(ValueError, match="cannot sample yet"):
        require_sampling_support("x", _GreedyOnlyDecoder(), SAMPLING)  # an instance too


@pytest.mark.parametrize("cls", [VanillaDecoder, SpeculativeDecoder, PromptLookupDecoder, HFAssistedDecoder,
                                 HFGreedyDecoder, LookaheadDecoder, OuroborosDecoder])
def test_sampling_decoders_declare_it(cls):
    require_sampling_support("x", cls, SAMPLING)


# --- runner ---------------------------------------------------------------------------------------------

def _run(tmp_path, *overrides):
    return run_tiny_job(tmp_path, *overrides, max_new_tokens=8)


def test_runner_sampled_rows(tmp_path):
    # (hf_assisted cannot sample with tiny-random's padded vocabularies: test_hf_assisted.py)
    decoders = ["vanilla", "speculative", "prompt_lookup", "hf_greedy", "lookahead", "ouroboros"]
    _run(tmp_path, f"decoder=[{','.join(decoders)}]", "runner.temperature=0.7", "runner.top_p=0.9", "runner.seed=3")
    rows = result_rows(tmp_path)
    assert [r["decoder"] for r in rows] == decoders * 2
    for r in rows:
        assert r["status"] == "ok", r.get("reason")
        assert (r["temperature"], r["top_p"], r["top_k"], r["sampling_seed"]) == (0.7, 0.9, 0, 3)
        assert r["sample_seed"] == sample_seed(3, r["sample_id"], 0, 0)  # paired: same seed per sample
        assert r["matches_vanilla"] is None and r["first_divergence"] is None
        assert r["equality_check"] == "n/a (sampled)"
    # Another run seed: other draws (vanilla's outputs change on at least one sample).
    _run(tmp_path / "b", "decoder=[vanilla]", "runner.temperature=0.7", "runner.top_p=0.9", "runner.seed=4")
    assert [r["token_ids"] for r in result_rows(tmp_path / "b")] != [r["token_ids"] for r in rows[::len(decoders)]]


def test_runner_greedy_rows_unchanged(tmp_path):
    _run(tmp_path, "decoder=[vanilla,speculative]")
    for r in result_rows(tmp_path):
        assert r["matches_vanilla"] is True and r["equality_check"] == "exact"
        assert (r["temperature"], r["top_p"], r["top_k"], r["sampling_seed"], r["sample_seed"]) == (0.0, 1.0, 0, None,
                                                                                                      None)


def test_runner_refuses_greedy_only_decoders_before_loading(tmp_path, monkeypatch):
    import harness.job.app

    monkeypatch.setattr(harness.job.app, "load_pair", lambda *a, **k: pytest.fail("models loaded before the check"))
    monkeypatch.setattr(LookaheadDecoder, "supports_sampling", False)  # stands in for a greedy-only decoder
    with pytest.raises(ConfigError, match="'lookahead'.*cannot sample"):
        _run(tmp_path, "decoder=[vanilla,lookahead]", "runner.temperature=0.7")
    with pytest.raises(ValueError, match=r"^runner\.top_k=5: only applies when sampling"):
        _run(tmp_path, "decoder=[vanilla]", "runner.top_k=5")
    assert not (tmp_path / "results.jsonl").exists()


def test_resume_never_mixes_greedy_and_sampled_cells(tmp_path, capsys):
    _run(tmp_path, "decoder=[vanilla]", "task.limit=1")
    # a sampled run into a greedy run's folder is refused (run.py: exit 2), naming the setting (the run identity
    # covers it)
    with pytest.raises(ConfigError, match=r"runner\.temperature: 0\.0 -> 0\.7"):
        _run(tmp_path, "decoder=[vanilla]", "task.limit=1", "runner.temperature=0.7")
    assert [r["temperature"] for r in result_rows(tmp_path)] == [0.0]  # nothing was written
    _run(tmp_path / "sampled", "decoder=[vanilla]", "task.limit=1", "runner.temperature=0.7")
    _run(tmp_path / "sampled", "decoder=[vanilla]", "task.limit=1", "runner.temperature=0.7")
    # ... but a sampled run resumes its own
    assert [r["temperature"] for r in result_rows(tmp_path / "sampled")] == [0.7]


def test_runner_refuses_a_setting_the_pair_cannot_honour_in_one_line(tmp_path):
    """hf_assisted cannot sample with tiny-random's padded vocabularies: a ConfigError naming the decoder (one
    line, exit 2 from run.py), raised while building decoders, before any cell runs or any row is written."""
    with pytest.raises(ConfigError, match=r"^decoder hf_assisted: hf_assisted cannot sample with this pair") as e:
        _run(tmp_path, "decoder=[vanilla,hf_assisted]", "runner.temperature=0.7")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_ids_is_argmax_ties_included(dtype):
    """argmax_ids (max(-1).indices, fast for bfloat16 on CPUs) returns exactly torch.argmax's ids: the first
    maximum of each row, on rows full of ties, on one row, and on a batch of rows."""
    for seed in range(50):
        g = torch.Generator().manual_seed(seed)
        tied = (torch.randint(0, 6, (5, 700), generator=g).float() / 4).to(dtype)  # many equal maxima per row
        wide = torch.randn(3, 4099, generator=g).to(dtype)
        wide[:, 17] = wide[:, 2000] = wide.max()
        for x in (tied, wide, tied[0], wide[:, None, :]):
            assert torch.equal(argmax_ids(x), x.argmax(-1))
