"""Rows of older versions read as today's (harness/rows/legacy.py), and labelled as the README labels them."""

import math

import pandas as pd

from harness.rows import grouping, legacy


def _old_rows():
    return pd.DataFrame({"decoder": ["vanilla", "opt_tree_best_tuned"], "sample_id": ["a", "a"],
                         "decoder_params": ["{}", '{"num_nodes": 16, "copy_tokens": 20, "draft_on_copy": false}'],
                         "temperature": [None, 0.0], "run_identity": ["r1", "r1"], "turn": [None, 1],
                         "load_avg_1m_before": [0.5, 0.6], "load_avg_1m_after": [0.7, 0.8]})


def test_an_old_row_is_upgraded_once_in_one_place():
    meta = {"config": {"decoder": {"opt_tree_best_tuned": {"_target_": "decoders.opt_tree.OptTreeDecoder"}}}}
    up = legacy.upgrade(_old_rows(), meta)
    assert list(up["decoder_class"]) == ["vanilla", "OptTreeDecoder"]      # from the run's meta.json config
    assert list(up["temperature"]) == [0.0, 0.0] and list(up["turn"]) == [0, 1]
    assert list(up["top_p"]) == [1.0, 1.0] and list(up["top_k"]) == [0, 0]  # columns an older row never had
    assert list(up["group_identity"]) == ["r1", "r1"] and list(up["status"]) == ["ok", "ok"]
    assert list(up["load_1m_before"]) == [0.5, 0.6] and "load_avg_1m_before" not in up
    assert math.isnan(up["tokens_per_s"].iloc[0])                         # rows that never ran
    assert legacy.upgrade(up, meta).equals(up)                            # idempotent
    kept = legacy.upgrade(_old_rows().assign(decoder_class=["VanillaDecoder", "X"]), meta)
    assert list(kept["decoder_class"]) == ["VanillaDecoder", "X"]         # a row's own column wins


def test_a_setting_off_its_declared_default_is_named_wherever_a_configuration_is_labelled():
    """draft_on_copy defaults to true: false is a setting, not "off" (the README and the report once differed)."""
    params = '{"num_nodes": 16, "copy_tokens": 20, "draft_on_copy": false}'
    assert grouping.settings_label(params, decoder_class="OptTreeDecoder") == "nodes=16, copy=20, draft on copy=false"
    assert grouping.settings_label('{"_target_": "decoders.opt_tree.OptTreeDecoder", "num_nodes": 16, '
                                   '"copy_tokens": 20, "draft_on_copy": false}') == \
        "nodes=16, copy=20, draft on copy=false"
    assert grouping.settings_label(params) == "nodes=16, copy=20"           # no class known: false reads as off


def test_an_old_row_without_a_draft_shape_reads_its_family_s():
    # Before: theory.tex printed "n/a (draft shape: unknown)" for lookahead and Ouroboros rows of older runs.
    def shape(decoder, drafted=3):
        return grouping.draft_shape(pd.DataFrame({"decoder": [decoder], "num_drafted": [drafted]}))

    assert [shape(d) for d in ("speculative_tuned", "lookahead", "prompt_lookup_tuned", "ouroboros_prompt_warm",
                               "opt_tree_best_tuned", "fixed_tree_binary", "hf_assisted")] == \
        ["chain", "n-grams", "copy", "phrases", "tree", "tree", "dynamic chain"]
    assert shape("speculative", 0) == "chain" and shape("vanilla", 0) == "none" and shape("lookahead", 0) == "none"
    assert shape("my_decoder") == "unknown"                                  # a name no family declares
    assert grouping.draft_shape(pd.DataFrame({"decoder": ["lookahead"], "draft_shape": ["copy"]})) == "copy"
