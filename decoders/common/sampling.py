"""Sampling settings and the helpers every sampling decoder shares.

What lives here: :class:`SamplingConfig` (temperature, top-p, top-k; temperature 0 = greedy, the default),
which turns raw logits into the *processed* next-token distribution with transformers' own logits warpers
(``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``, in the order transformers'
``generate`` applies them), so every decoder -- ours and ``hf_assisted`` -- samples from
the same distribution; :func:`sample_token` (one draw with an explicit ``torch.Generator``);
:func:`sample_seed` (the per-cell seed derived from the run seed, so every decoder of one sample gets the
same seed); :func:`require_sampling_support` (decoders that cannot sample refuse ``temperature > 0``).

What does not: the acceptance rules (:mod:`decoders.common.verify`) and any global RNG state: decoders
draw only from the generator they are given.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen from the logits, shared by every decoder of a run.

    Args:
        temperature: ``0`` = greedy (argmax; the float32 equality contract applies); ``> 0`` = sample from
            ``softmax(logits / temperature)`` after top-k / top-p filtering. Finite, ``>= 0``.
        top_p: nucleus filtering, ``0 < top_p <= 1`` (``1`` = off). Only with ``temperature > 0``.
        top_k: keep the ``top_k`` most likely tokens, integer ``>= 0`` (``0`` = off). Only with
            ``temperature > 0``.

    Raises:
        ValueError: on values out of range, or ``top_p`` / ``top_k`` set with ``temperature == 0``
            (greedy decoding would silently ignore them).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    _warpers: tuple[LogitsProcessor, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        t, p, k = self.temperature, self.top_p, self.top_k
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1] (1 = off), got {p!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {k!r}")
        if t == 0 and (p != 1 or k != 0):
            raise ValueError(f"top_p={p} / top_k={k} only apply when sampling: set temperature > 0, or leave "
                             "top_p=1.0 and top_k=0 for greedy decoding")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))
        # The same warpers, in the same order, as transformers' GenerationMixin._get_logits_processor with
        # do_sample=True (temperature only when != 1, top-k only when != 0, top-p only when < 1).
        processors: list[LogitsProcessor] = []
        if t > 0:
            if t != 1.0:
                processors.append(TemperatureLogitsWarper(float(t)))
            if k != 0:
                processors.append(TopKLogitsWarper(top_k=k, min_tokens_to_keep=1))
            if p < 1.0:
                processors.append(TopPLogitsWarper(top_p=float(p), min_tokens_to_keep=1))
        object.__setattr__(self, "_warpers", tuple(processors))

    @property
    def greedy(self) -> bool:
        """True at temperature 0: decoders take the argmax and draw no random numbers."""
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed next-token distribution(s).

        Args:
            logits: raw logits, ``torch.Tensor`` of shape ``(..., vocab_size)`` in any float dtype.

        Returns:
            ``torch.FloatTensor`` (float32) of the same shape: ``softmax(warpers(logits))``, each row summing
            to 1, zero where top-k / top-p filtered a token out.

        Raises:
            ValueError: when greedy (there is no distribution to sample from).
        """
        if self.greedy:
            raise ValueError("SamplingConfig.probs is only defined for temperature > 0")
        shape = logits.shape
        scores = logits.reshape(-1, shape[-1]).float()
        # The warpers used here ignore input_ids (they filter each row of scores on its own).
        no_ids = torch.empty((scores.shape[0], 0), dtype=torch.long, device=scores.device)
        # Each warper called in turn, as LogitsProcessorList does, without its per-call signature inspection
        # (~0.1 ms a call on a CPU: more than the warpers' own work on a small vocabulary).
        for warper in self._warpers:
            scores = warper(no_ids, scores)
        return scores.softmax(dim=-1).reshape(shape)

    def next_token(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """The argmax of ``logits`` (greedy) or a draw from :meth:`probs` with ``generator``.

        Args:
            logits: raw logits of one position, ``torch.Tensor`` of shape ``(vocab_size,)``.
            generator: required when sampling.
        """
        if self.greedy:
            return int(argmax_ids(logits))
        return sample_token(self.probs(logits), generator)

    def generation_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``transformers.GenerationConfig`` that select the same processing.

        Every field is explicit (``top_k=0`` included: transformers' global default would otherwise add
        ``top_k=50``).
        """
        if self.greedy:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    def columns(self) -> dict[str, Any]:
        """Result-row columns describing the setting."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


#: The default: greedy decoding.
GREEDY = SamplingConfig()


def argmax_ids(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dimension (``torch.LongTensor`` of ``logits.shape[:-1]``): the first maximal
    index of each row, the rule of ``torch.argmax``; computed as ``logits.max(-1).indices`` unless ``logits`` are
    float32.

    Same ids either way (ties included: both return the first maximum), but for bfloat16 logits on a CPU ``argmax``
    takes a slow path: with torch 2.13 on a 2-core AMD EPYC [26/2], one 151,936-wide row took 0.49 ms against
    0.08 ms, and the 62 rows of a tree verification 15.3 ms against 2.8 ms. In float32 ``argmax`` is the cheaper
    call (one output tensor, not two): 1.8 against 3.4 us on one 260-wide row, 128 against 131 us on a 151,936-wide
    one (AMD EPYC [25/17]).
    """
    return logits.argmax(-1) if logits.dtype == torch.float32 else logits.max(-1).indices


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from ``probs``.

    Args:
        probs: ``torch.FloatTensor`` of shape ``(vocab_size,)``, non-negative, summing to 1.
        generator: the only source of randomness; must live on ``probs``' device.

    Returns:
        The sampled id.
    """
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_seed(run_seed: int, sample_id: Any, turn: int = 0, repeat: int = 0) -> int:
    """The seed of one (sample, turn, repeat) cell, shared by every decoder of that cell (paired design).

    A stable hash (SHA-256, not Python's salted ``hash``) of ``"run_seed/sample_id/turn/repeat"``, reduced to
    63 bits, so it is the same on every machine and process.

    Example:
        ``sample_seed(0, "HumanEval/0")`` is the same in every run with ``runner.seed=0``, and differs from
        ``sample_seed(0, "HumanEval/0", repeat=1)`` and from ``sample_seed(1, "HumanEval/0")``.
    """
    key = f"{int(run_seed)}/{sample_id}/{int(turn)}/{int(repeat)}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (draws on CUDA and CPU differ for one seed)."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def check_generator(sampling: SamplingConfig, generator: torch.Generator | None) -> None:
    """Raise ``ValueError`` when a sampling decoder is called without a generator."""
    if not sampling.greedy and generator is None:
        raise ValueError("sampled decoding (temperature > 0) needs generator=torch.Generator(...): decoders never "
                         "draw from the global RNG (see decoders.common.sampling.make_generator)")


def require_sampling_support(name: str, decoder: Any, sampling: SamplingConfig) -> None:
    """Refuse a decoder that cannot sample when ``temperature > 0`` (it would silently decode greedily).

    A decoder declares that it samples with a class attribute ``supports_sampling = True``; ``decoder`` may be
    the class (checked before any model loads) or an instance.

    Raises:
        ValueError: ``temperature > 0`` and ``decoder`` does not declare ``supports_sampling``.
    """
    if not sampling.greedy and not getattr(decoder, "supports_sampling", False):
        kind = decoder.__name__ if isinstance(decoder, type) else type(decoder).__name__
        raise ValueError(f"decoder {name!r} ({kind}) cannot sample yet: it decodes greedily only. "
                         f"Use runner.temperature=0, or drop {name!r} from the decoder list for a sampled run")
