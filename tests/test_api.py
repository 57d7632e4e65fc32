"""The README's "Python API" snippet runs as written (tiny random models, CPU), and `python run.py list`
describes every config."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.precheck import available

ROOT = Path(__file__).resolve().parent.parent


def readme_snippet() -> str:
    text = (ROOT / "docs" / "running.md").read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_api_snippet_runs(capsys):
    code = readme_snippet()
    assert "load_pair_by_name" in code and "build_decoder" in code and ".generate(" in code
    scope: dict = {}
    exec(compile(code, "docs/running.md (Python API)", "exec"), scope)
    result = scope["result"]
    assert result.new_tokens == 24 and result.accept_length >= 1.0
    assert result.token_ids == scope["reference"].token_ids
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[0] == "24"


def test_build_decoder_refuses_unknown_names_and_missing_drafts():
    from harness.api import build_decoder, load_pair_by_name

    pair = load_pair_by_name("tiny-random", device="cpu", need_draft=False)
    with pytest.raises(ValueError, match="choose from"):
        build_decoder("speculativ", pair)
    with pytest.raises(ValueError, match="needs a draft"):
        build_decoder("speculative", pair)
    with pytest.raises(ValueError, match="choose from"):
        load_pair_by_name("tiny-randm")
    assert build_decoder("prompt_lookup", pair, num_draft_tokens=3).generate is not None


def test_build_decoder_takes_the_runner_supplied_eos_ids_and_sampling():
    from decoders.common.sampling import SamplingConfig
    from harness.api import build_decoder, load_pair_by_name

    pair = load_pair_by_name("tiny-random", device="cpu")
    default = build_decoder("speculative", pair)
    assert default.eos_token_ids and default.sampling.greedy  # the tokenizer's EOS ids, greedy
    sampling = SamplingConfig(temperature=0.7)
    dec = build_decoder("speculative", pair, eos_token_ids=frozenset(), sampling=sampling, gamma=3)
    assert dec.eos_token_ids == frozenset() and dec.sampling is sampling and dec.gamma == 3


def test_run_py_list_describes_every_config():
    res = subprocess.run([sys.executable, "run.py", "list"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for group in ("model", "decoder", "task", "experiment"):
        assert f"{group} ({group}=NAME" in out
        for name in available(group):
            line = next(line for line in out.splitlines() if line.strip().split(" ")[0] == name)
            assert len(line.split(None, 1)) == 2, f"{group}/{name} has no description"
    assert re.search(r"^\s+speculative\s+Draft-model speculative decoding", out, re.M)
    assert "decoder (decoder=NAME; its settings: python run.py list decoder=NAME):" in out
    bad = subprocess.run([sys.executable, "run.py", "list", "nope"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "unknown config group" in bad.stderr


@pytest.mark.parametrize("overrides,fragment", [
    (["decoder=typo"], "unknown decoder 'typo'"),
    (["decoder=[speculativ]"], "did you mean speculative?"),
    (["decoder=[speculative]", "decoder.speculative.gama=3"], "unknown key decoder.speculative.gama"),
    (["runner.max_new_tokens=0"], "runner.max_new_tokens=0"),
])
def test_a_bad_override_is_one_clean_line(overrides, fragment):
    # Before: decoder=typo was a 54-line Hydra traceback (MissingConfigException) with advice for Hydra's search path
    from harness.api import compose_config
    from harness.config.compose import ConfigError

    with pytest.raises(ConfigError) as e:
        compose_config(overrides)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no chained Hydra traceback
