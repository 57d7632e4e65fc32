"""Draft-model speculative decoding, greedy or sampled.

Leviathan, Kalman & Matias 2023 ("Fast Inference from Transformers via Speculative Decoding",
arXiv 2211.17192, Algorithm 1) and Chen et al. 2023 (arXiv 2302.01318, Algorithm 2): the draft model
proposes ``gamma`` tokens autoregressively, the target model scores all of them in one forward, and
rejected tokens are rolled back from both KV caches.

* Greedy (temperature 0): the longest prefix matching the target's argmax is accepted, then the target's
  own next token (the bonus token) -- :func:`decoders.common.verify.greedy_verify`.
* Sampling (temperature > 0): the draft samples each token from its own processed distribution (the same
  warpers as the target, :class:`decoders.common.sampling.SamplingConfig`), and the target accepts by
  modified rejection sampling -- accept ``x`` with ``min(1, target_probs[x] / draft_probs[x])``, on rejection
  resample from ``normalize(max(0, target_probs - draft_probs))``, a bonus token from ``target_probs`` after a
  fully accepted draft (:func:`decoders.common.verify.rejection_verify`). The output is distributed exactly
  as vanilla sampling's.
"""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_input_ids
from decoders.common.forward import forward, new_cache
from decoders.common.kv_cache import check_rollback, crop
from decoders.common.sampling import GREEDY, SamplingConfig, check_generator, sample_token
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.common.verify import greedy_verify, rejection_verify
from decoders.types import NULL_STOPWATCH, DecodeResult, StepRecord, Stopwatch


def check_gamma(gamma: int) -> int:
    """Return ``gamma`` if it is an integer >= 1, else raise ``ValueError``."""
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per step) must be an integer >= 1, got {gamma!r}")
    return gamma


class SpeculativeDecoder:
    """Speculative decoding with a draft model (greedy, or lossless sampling by rejection sampling).

    Cache invariant between steps: both caches hold KV for every committed token except the last one
    (``pending``), which is fed first in the next forward. After a fully accepted draft the draft cache
    also lacks the last draft token; it is fed together with ``pending`` in the next draft forward.

    Args:
        target_model: the model whose greedy output is reproduced.
        draft_model: a smaller model with the same tokenizer.
        gamma: draft tokens per step (>= 1). Near the end the draft is shortened so a step never
            produces more than ``max_new_tokens``.
        eos_token_ids: ids that end generation. Drafting also stops early at an EOS draft token.
        sampling: greedy (the default) or the sampling settings of the run, applied to both models.

    Raises:
        ValueError: if ``gamma < 1``, ``draft_model`` is missing, or either model's KV cache cannot be rolled
            back (:func:`decoders.common.kv_cache.check_rollback`).
    """

    name = "speculative"
    supports_sampling = True

    def __init__(
        self,
        target_model: PreTrainedModel,
        draft_model: PreTrainedModel | None,
        gamma: int = 4,
        eos_token_ids: Iterable[int] = (),
        sampling: SamplingConfig = GREEDY,
    ):
        if draft_model is None:
            raise ValueError("the speculative decoder needs a draft model: choose a model pair with a draft")
        self.target_model = target_model
        self.draft_model = draft_model
        self.gamma = check_gamma(gamma)
        check_rollback(target_model, "target model", self.name)
        check_rollback(draft_model, "draft model", self.name)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sampling = sampling
        # Padded embedding sizes may differ (e.g. 151936 vs 152064): the draft may only propose ids the
        # target can embed and score, and drafts nothing from a context holding an id it cannot embed itself.
        self._target_vocab = target_model.get_output_embeddings().out_features
        self._draft_vocab = min(
            target_model.get_input_embeddings().num_embeddings, self._target_vocab,
            draft_model.get_output_embeddings().out_features,
        )
        self._draft_embed = draft_model.get_input_embeddings().num_embeddings

    def _draft_next(self, d_logits: torch.Tensor, generator: torch.Generator | None
                    ) -> tuple[int, torch.Tensor | None]:
        """The draft's next token from its last-position logits, and (sampling) the distribution it was
        drawn from, ``torch.FloatTensor`` of shape ``(target_vocab,)`` (zero beyond the shared ids)."""
        logits = d_logits[0, -1, : self._draft_vocab]
        if self.sampling.greedy:
            return int(logits.argmax()), None
        probs = torch.zeros(self._target_vocab, dtype=torch.float32, device=logits.device)
        probs[: self._draft_vocab] = self.sampling.probs(logits)
        return sample_token(probs, generator), probs

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None,
                 stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode; same contract as :meth:`decoders.vanilla.VanillaDecoder.generate` (``generator``: the
        only source of randomness, required when sampling; ``stopwatch``: the runner's timer).

        Each :class:`StepRecord` carries ``drafted`` (tokens proposed), ``accepted``, ``draft_forwards``
        and the tokens fed to each model.
        """
        check_input_ids(input_ids)
        check_max_new_tokens(max_new_tokens)
        check_generator(self.sampling, generator)
        greedy = self.sampling.greedy
        device = input_ids.device
        prompt_len = input_ids.shape[1]
        target_cache, draft_cache = new_cache(self.target_model), new_cache(self.draft_model)

        logits = forward(self.target_model, input_ids, target_cache, logits_to_keep=1)
        out = [self.sampling.next_token(logits[0, -1], generator)]
        (stopwatch or NULL_STOPWATCH).first_token()
        steps = [StepRecord(target_tokens_fed=prompt_len, emitted=1, source={"bonus": 1})]
        # The draft's prefill (the prompt) is charged to the first drafting step.
        draft_feed = input_ids[0].tolist()

        finished = max_new_tokens == 1 or out[0] in self.eos_token_ids
        while not finished:
            committed = prompt_len + len(out)  # tokens known so far; the last one is pending
            gamma = min(self.gamma, max_new_tokens - len(out) - 1)
            draft_tokens: list[int] = []
            draft_probs: list[torch.Tensor] = []  # sampling only: what each draft token was drawn from
            draft_forwards = draft_tokens_fed = 0
            feed = draft_feed + [out[-1]]
            if gamma > 0 and max(feed) < self._draft_embed:  # an id the draft cannot embed: draft nothing
                while len(draft_tokens) < gamma:
                    d_logits = forward(
                        self.draft_model, torch.tensor([feed], device=device), draft_cache, logits_to_keep=1
                    )
                    draft_forwards += 1
                    draft_tokens_fed += len(feed)
                    token, probs = self._draft_next(d_logits, generator)
                    draft_tokens.append(token)
                    if probs is not None:
                        draft_probs.append(probs)
                    if token in self.eos_token_ids:
                        break
                    feed = [token]
            # Verify: pending token + draft, one target forward.
            verify_ids = torch.tensor([[out[-1], *draft_tokens]], device=device)
            t_logits = forward(self.target_model, verify_ids, target_cache)
            drafted = torch.tensor(draft_tokens, device=device, dtype=torch.long)
            if greedy:
                n, bonus = greedy_verify(drafted, t_logits[0].argmax(-1))
            else:
                stacked = (torch.stack(draft_probs) if draft_probs
                           else torch.zeros((0, self._target_vocab), dtype=torch.float32, device=device))
                n, bonus = rejection_verify(drafted, stacked, self.sampling.probs(t_logits[0]), generator)
            # An EOS among the accepted drafts ends generation; the bonus token after it is neither kept nor counted.
            emitted = truncate_at_stop([*draft_tokens[:n], bonus], self.eos_token_ids, max_new_tokens - len(out))
            out.extend(emitted)
            finished = len(out) >= max_new_tokens or not self.eos_token_ids.isdisjoint(emitted)
            kept = min(n, len(emitted))
            steps.append(
                StepRecord(
                    target_tokens_fed=len(draft_tokens) + 1,
                    emitted=len(emitted),
                    drafted=len(draft_tokens),
                    accepted=kept,
                    draft_forwards=draft_forwards,
                    draft_tokens_fed=draft_tokens_fed,
                    source={"draft": kept, "bonus": len(emitted) - kept},
                )
            )
            # Roll back: keep committed-so-far (incl. the old pending) + accepted drafts.
            crop(target_cache, committed + n)
            if draft_tokens:
                draft_len = draft_cache.get_seq_length()  # = committed + len(draft_tokens) - 1
                keep = min(draft_len, committed + n)
                crop(draft_cache, keep)
                # Tokens the draft cache still lacks, except the new pending bonus token.
                draft_feed = out[keep - prompt_len : -1]
            else:
                draft_feed = draft_feed + out[-2:-1] if len(out) >= 2 else draft_feed
        return DecodeResult(tuple(truncate_at_stop(out, self.eos_token_ids, max_new_tokens)), tuple(steps))
