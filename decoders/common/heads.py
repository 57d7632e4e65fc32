"""How a decoder turns a forward into next-token scores: the full LM head, or a reduced draft vocabulary.

What lives here: :class:`FullHead` (the model's own logits, optionally cut to ids below a limit, e.g. what the
target can embed) and :class:`ReducedVocabHead` (the draft's argmax over its most frequent ids only, as
FR-Spec, Zhao et al. 2025, arXiv 2502.14856, and EAGLE-3's draft vocabulary do), plus
:func:`merge_rank_ids`, the deterministic frequency ranking used for it. Both run the stock model through its
public forward (input ids, position ids, attention mask, KV cache); nothing is patched. What does not live
here: the layouts and verification that use the scores (:mod:`decoders.common.lookahead_step`).

Only the DRAFT may use a reduced head: its predictions are proposals the target verifies, so the output stays
the target's greedy output whatever the draft vocabulary. The target always uses :class:`FullHead`.
"""

from __future__ import annotations

import logging
from typing import Iterable

import torch
from transformers import DynamicCache, PreTrainedModel

from decoders.common.forward import forward, positions

log = logging.getLogger(__name__)


def pair_vocab(target_model: PreTrainedModel, draft_model: PreTrainedModel) -> tuple[int, int, int]:
    """Vocabulary bounds of a target/draft pair whose padded embedding sizes may differ (e.g. 151936 vs 152064).

    Returns:
        ``(target_vocab, draft_vocab, draft_embed)``: the columns of the target's logits; the ids the draft may
        propose (below what the target can embed and score and what the draft's LM head scores); the ids the
        draft can embed (a context holding a larger id cannot be drafted from).
    """
    target_vocab = target_model.get_output_embeddings().out_features
    draft_vocab = min(target_model.get_input_embeddings().num_embeddings, target_vocab,
                      draft_model.get_output_embeddings().out_features)
    return target_vocab, draft_vocab, draft_model.get_input_embeddings().num_embeddings


class FullHead:
    """Logits of the model's own LM head over ids ``[0, limit)``.

    Args:
        model: a transformers causal LM.
        limit: only ids below this are scored (``None`` = the whole output vocabulary).
    """

    def __init__(self, model: PreTrainedModel, limit: int | None = None):
        self.model = model
        self.limit = limit
        out = model.get_output_embeddings().out_features
        self.columns = min(limit, out) if limit is not None else out  # logit columns per position

    def logits(
        self,
        input_ids: torch.Tensor,
        cache: DynamicCache,
        *,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        keep: int | torch.Tensor = 1,
    ) -> torch.Tensor:
        """One forward (see :func:`decoders.common.forward.forward`); returns ``(k, vocab)`` logits of the kept
        positions (``keep``: the last ``keep`` positions, or a ``torch.LongTensor`` of indices)."""
        out = forward(self.model, input_ids, cache, position_ids=position_ids, attention_mask=attention_mask,
                      logits_to_keep=keep)
        return out[0, :, : self.limit]

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Token ids of logit columns (the identity here)."""
        return columns


class ReducedVocabHead:
    """The draft's LM head restricted to ``ids``: ``logits = hidden @ lm_head.weight[ids].T`` (+ bias).

    The base model (``model.get_decoder()``) runs with the usual position ids, mask and cache and returns hidden
    states; only the kept positions are projected, onto ``len(ids)`` rows instead of the whole vocabulary. With
    a 0.5B draft and a 152k vocabulary the LM head is a large share of each draft forward, which is what this
    saves (FR-Spec, arXiv 2502.14856, section 3).

    Args:
        model: the draft model (a transformers causal LM with a linear output embedding).
        ids: the token ids the draft may propose (any order; duplicates dropped).

    Raises:
        ValueError: if ``ids`` is empty or holds an id outside the output vocabulary.
    """

    def __init__(self, model: PreTrainedModel, ids: Iterable[int]):
        head = model.get_output_embeddings()
        ids_t = torch.tensor(sorted({int(i) for i in ids}), dtype=torch.long)
        if ids_t.numel() == 0 or int(ids_t[0]) < 0 or int(ids_t[-1]) >= head.weight.shape[0]:
            raise ValueError(f"the reduced draft vocabulary needs ids in [0, {head.weight.shape[0]}), "
                             f"got {ids_t.numel()} ids")
        self.model = model
        self.base = model.get_decoder()
        device = head.weight.device
        self.ids = ids_t.to(device)
        self.columns = int(ids_t.numel())  # logit columns per position
        with torch.no_grad():
            self.weight = head.weight.index_select(0, self.ids).contiguous()  # (len(ids), hidden_size)
            bias = getattr(head, "bias", None)
            self.bias = bias.index_select(0, self.ids) if bias is not None else None

    @torch.inference_mode()
    def logits(
        self,
        input_ids: torch.Tensor,
        cache: DynamicCache,
        *,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        keep: int | torch.Tensor = 1,
    ) -> torch.Tensor:
        """Same contract as :meth:`FullHead.logits`; columns follow the sorted ``ids``."""
        if position_ids is None:
            position_ids = positions(cache.get_seq_length(), input_ids.shape[1], input_ids.device)
        hidden = self.base(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                           cache=cache, use_cache=True).last_hidden_state[0]
        hidden = hidden[-keep:] if isinstance(keep, int) else hidden.index_select(0, keep.to(hidden.device))
        out = hidden @ self.weight.T
        return out + self.bias if self.bias is not None else out

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Token ids of logit columns."""
        return self.ids[columns.to(self.ids.device)].to(columns.device)


def draft_head(model: PreTrainedModel, size: int, limit: int, always: Iterable[int] = ()
               ) -> FullHead | ReducedVocabHead:
    """The draft's head as a decoder's ``draft_vocab_size`` setting asks: :class:`ReducedVocabHead` over
    :func:`merge_rank_ids` ``(size, limit, always)`` when ``size >= 1``, else :class:`FullHead` over ids below
    ``limit`` (what the target can embed and score). Built once per decoder: the reduced head copies its rows of
    the LM head's weight (``size x hidden_size`` in the draft's dtype).

    A ``size`` not below ``limit`` gives a head of every id (the setting then cuts nothing; a real model's setting
    run on a tiny model's vocabulary, say) and logs a warning saying so.

    Raises:
        ValueError: from :class:`ReducedVocabHead`.
    """
    if size >= limit:
        log.warning("draft_vocab_size=%d is not below the draft's vocabulary (%d ids the target can score): the "
                    "reduced head holds every id and cuts nothing", size, limit)
    return ReducedVocabHead(model, merge_rank_ids(size, limit, always)) if size else FullHead(model, limit)


def merge_rank_ids(size: int, limit: int, always: Iterable[int] = ()) -> list[int]:
    """The ``size`` most frequent ids by BPE merge rank, plus ``always`` (e.g. EOS ids), all below ``limit``.

    Byte-level BPE vocabularies (GPT-2, Qwen2, Llama 3) number tokens in merge order: the byte alphabet first,
    then each merge in the order training applied it, i.e. by decreasing pair frequency in the tokenizer's
    training corpus. The lowest ids are therefore a frequency ranking that depends on no evaluation data and
    is computed without any corpus (FR-Spec ranks by token counts of a separate corpus; this is the
    corpus-free variant). Special tokens sit at the end of the vocabulary and are added through ``always``.

    Example:
        ``merge_rank_ids(4, 10, always=[9])`` -> ``[0, 1, 2, 3, 9]``.

    Args:
        size: ids wanted by rank (>= 1).
        limit: exclusive upper bound (what both models can embed / the draft can output).
        always: ids included whatever their rank (end-of-sequence ids).

    Returns:
        Sorted ids.
    """
    return sorted({*range(min(size, limit)), *(int(i) for i in always if 0 <= int(i) < limit)})
