"""A small Python API for notebooks: load a model pair and build decoders by their config names, exactly as
``run.py`` composes them (``conf/``, Hydra's compose API, so the configs' schemas and defaults apply).

Example (tiny random models; no network)::

    from harness.api import build_decoder, encode, load_pair_by_name

    pair = load_pair_by_name("tiny-random", device="cpu")       # conf/model/tiny-random.yaml
    decoder = build_decoder("speculative", pair, gamma=3)        # conf/decoder/speculative.yaml + override
    result = decoder.generate(encode(pair, "def add(a, b):"), max_new_tokens=32)
    print(result.new_tokens, result.accept_length, pair.tokenizer.decode(list(result.token_ids)))

Timing, pairing with vanilla and result rows are the runner's job (``python run.py``); this module only
builds the pieces.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from decoders.common.sampling import GREEDY, SamplingConfig
from harness.job.app import CONF_DIR, supplied_arguments
from harness.job.app import build_decoder as app_build_decoder
from harness.config.compose import ConfigError, compose
from harness.config.precheck import available, check_choices, decoder_key
from harness.job.models import ModelPair, load_pair
from tasks.base import encode_prompt


def _value(v: Any) -> str:
    """A Python value as a Hydra override value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The run config ``run.py`` would compose with these command-line ``overrides``, checked as ``run.py``
    checks it (:func:`harness.config.compose.compose`).

    Raises:
        ConfigError: (a ``ValueError``) an unknown config name (``decoder=typo``: the valid choices and the
            nearest name), an unknown key, a wrong type, a value out of bounds or a malformed override; one line
            per problem, without Hydra's traceback.
    """
    overrides = list(overrides)
    try:
        check_choices(overrides)  # the command line's did-you-mean, not Hydra's search-path listing
        return compose(overrides)
    except ConfigError as e:
        raise ConfigError(str(e)) from None  # the message says it all; Hydra's chained traceback does not help


def load_pair_by_name(model: str, device: str = "auto", need_draft: bool = True, **overrides: Any) -> ModelPair:
    """Load the target/draft pair of ``conf/model/<model>.yaml``.

    Args:
        model: a config name (``python run.py list model``), e.g. ``"tiny-random"``.
        device: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"``, ...
        need_draft: also load the draft model.
        overrides: model settings, e.g. ``dtype="float32"``.

    Raises:
        ValueError: an unknown model name (the message lists the valid ones).
    """
    if model not in available("model"):
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(available('model'))}")
    cfg = compose_config([f"model={model}", *(f"model.{k}={_value(v)}" for k, v in overrides.items())])
    return load_pair(OmegaConf.to_container(cfg.model, resolve=True), device=device, need_draft=need_draft)


def build_decoder(name: str, pair: ModelPair, *, eos_token_ids: Iterable[int] | None = None,
                  sampling: SamplingConfig = GREEDY, **params: Any) -> Any:
    """The decoder of ``conf/decoder/<name>.yaml`` on ``pair``, with hyper-parameter ``params`` overriding
    the config's (e.g. ``gamma=3``). ``eos_token_ids`` (default: the tokenizer's and generation config's;
    ``frozenset()`` ignores EOS) and ``sampling`` (default greedy) are what the runner supplies.

    Returns:
        An object with ``generate(input_ids, max_new_tokens) -> decoders.types.DecodeResult``.

    Raises:
        ValueError: an unknown decoder name, or a decoder that needs a draft on a pair without one.
    """
    if name not in available("decoder"):
        raise ValueError(f"unknown decoder {name!r}; choose from {', '.join(available('decoder'))}")
    key = decoder_key(name)
    cfg = compose_config([f"decoder=[{name}]", *(f"decoder.{key}.{k}={_value(v)}" for k, v in params.items())])
    dcfg = OmegaConf.to_container(cfg.decoder[key], resolve=True)
    if dcfg.get("uses_draft") and pair.draft is None:
        raise ValueError(f"decoder {name} needs a draft model; load a pair with one (need_draft=True)")
    return app_build_decoder(dcfg, supplied_arguments(pair, eos_token_ids, sampling))


def encode(pair: ModelPair, text: str, chat: bool = False) -> torch.Tensor:
    """Token ids of ``text`` by the tokenizer's own convention (:func:`tasks.base.encode_prompt`, as the
    runner encodes prompts), shape (1, seq_len), int64, on the pair's device. ``chat``: ``text`` was rendered
    through the chat template."""
    return torch.tensor([encode_prompt(pair.tokenizer, text, chat)], dtype=torch.long, device=pair.device)
