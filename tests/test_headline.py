"""The README's headline table and the committed race report regenerate from the committed rows, byte for
byte (benchmarks/headline.py --check: :mod:`harness.protocols.headline`), and the check fails on a hand edit
of either. The hand-edit cases share one generation (:func:`generated`; ~25 s each on a 2-core CPU): the check
compares the same generated files whichever copy of the README and reports it is given."""

import os
import shutil
from pathlib import Path

import pytest

from harness.protocols import headline

ROOT = Path(__file__).resolve().parent.parent


def test_headline_and_committed_report_are_up_to_date(capsys):
    assert headline.main(["--check"]) == 0, capsys.readouterr().out[-3000:]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """One :func:`headline.generate` of the tables (in the repository root, as ``main`` runs it)."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        result = headline.generate(tmp_path_factory.mktemp("generated"), plots=False)
    finally:
        os.chdir(here)
    return lambda: result


def _copy_docs(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs" / "results", docs)
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    return readme, docs


def test_the_copies_pass_the_shared_generation(tmp_path, generated):
    """The cases below differ from this one only by their edit."""
    readme, docs = _copy_docs(tmp_path)
    assert headline.check(readme, docs, generated) == 0


def test_a_hand_edited_headline_number_fails_the_check(tmp_path, capsys, generated):
    readme, docs = _copy_docs(tmp_path)
    text = readme.read_text()
    start, end = text.index(headline.BEGIN), text.index(headline.END)
    block = text[start:end]
    edited = block.replace("| 1.00", "| 1.01", 1)
    assert edited != block
    readme.write_text(text[:start] + edited + text[end:])
    assert headline.check(readme, docs, generated) == 1
    assert "out of date" in capsys.readouterr().err


def test_a_hand_edited_committed_report_fails_the_check(tmp_path, capsys, generated):
    readme, docs = _copy_docs(tmp_path)
    main_md = docs / headline.HEADLINES[0].name / "main.md"   # a report the check owns
    main_md.write_text(main_md.read_text().replace("|", "| ", 1))
    assert headline.check(readme, docs, generated) == 1


def test_a_readme_without_markers_is_refused(tmp_path, capsys):
    readme, docs = _copy_docs(tmp_path)
    readme.write_text("# no markers\n")
    assert headline.main(["--check", "--readme", str(readme), "--docs", str(docs)]) == 2
    err = capsys.readouterr().err
    assert "markers" in err and str(readme.resolve()) in err and len(err.strip().splitlines()) == 1
    assert headline.main(["--check", "--readme", str(tmp_path), "--docs", str(docs)]) == 2  # a folder: one line
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.parametrize("decoder, params, label", [
    ("speculative_tuned", {"_target_": "decoders.speculative.SpeculativeDecoder", "gamma": 8},
     "speculative_tuned (gamma=8)"),
    ("prompt_lookup_tuned", {"_target_": "decoders.prompt_lookup.PromptLookupDecoder", "max_ngram_size": 3,
                             "num_draft_tokens": 20, "min_ngram_size": 1},
     "prompt_lookup_tuned (n=3, draft tokens=20)"),
    ("vanilla", {"_target_": "decoders.vanilla.VanillaDecoder"}, "vanilla"),
])
def test_settings_label_names_the_tuned_setting(decoder, params, label):
    assert headline.settings_label(decoder, params) == label


def test_settings_label_names_extensions_only_when_on():
    base = {"_target_": "decoders.ouroboros.OuroborosDecoder", "gamma": 6, "window_size": 4, "ngram_size": 4,
            "guess_set_size": 4, "topk": 3, "pool_scope": "sample", "seed": 0, "pool_from_prompt": False,
            "free_draft_min_match": 0, "draft_vocab_size": 0, "stop_confidence": 0.0, "branch_confidence": 0.0,
            "max_branches": 1}
    assert headline.settings_label("ouroboros_tuned", base) == "ouroboros_tuned (gamma=6, W=4, N=4, G=4, topk=3)"
    best = {**base, "pool_from_prompt": True, "free_draft_min_match": 3}
    assert headline.settings_label("ouroboros_best_tuned", best) == \
        "ouroboros_best_tuned (gamma=6, W=4, N=4, G=4, topk=3, prompt n-grams, free drafts from=3)"


def test_the_caption_names_each_dev_task_tuned_on():
    """Tuned on two dev tasks (``protocol.sh --dev humaneval,mbpp``): each task with its own problems, not one
    span over both tasks' numbers."""
    import pandas as pd

    def rows(task, ids):
        return pd.DataFrame({"status": "ok", "task": task, "sample_id": [f"{task}/{i}" for i in ids],
                             "max_new_tokens": 128, "dtype": "bfloat16", "device_name": "cpu",
                             "git_commit": "0123456789", "repeat": 0})

    race = rows("humaneval", range(20, 33))
    tuning = pd.concat([rows("humaneval", range(5)), rows("mbpp", range(511, 516))], ignore_index=True)
    h = headline.Headline("x", "Race", "results/reference/no_such_race", ("a/tune_all", "a/tune_all_mbpp"))
    text = headline.caption(h, race, tuning)
    assert "humaneval problems 20-32 (13 problems" in text
    assert "Settings tuned on humaneval problems 0-4 and mbpp problems 511-515 at 128 new tokens" in text
    assert "`experiment=tune_all` and `experiment=tune_all_mbpp`" in text
    gaps = pd.concat([rows("humaneval", [1, 5, 7]), rows("mbpp", range(511, 516))], ignore_index=True)
    text = headline.caption(h, race, gaps)
    assert "Settings tuned on humaneval problems 1, 5, 7 and mbpp problems 511-515 at" in text
