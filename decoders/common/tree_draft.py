"""The draft model's side of a tree proposer that grows its tree one layer per draft forward.

OPT-Tree (:mod:`decoders.opt_tree`) and the fixed trees (:mod:`decoders.fixed_tree`) differ only in which nodes
they expand and keep; both feed each layer's frontier to the draft model in one forward with tree attention over
every node fed earlier in the step, read the draft's next-token distributions, and after verification keep the
draft's KV entries of the accepted nodes it was fed. :class:`TreeDrafter` is that shared part:

* between steps its cache holds ``context[:cached]`` (with a ``draft_window``, as
  :func:`~decoders.common.base.draft_view` shows it: ``offset`` entries fewer); a step's first forward
  (:meth:`TreeDrafter.first_layer`) feeds the rest (at least the pending token), so the draft's prompt prefill is
  charged to the first step;
* within a step, the nodes fed (:meth:`TreeDrafter.layer`) follow the step's context in feed order, each named
  by the proposer's own key (any int ``>= 0``; ``-1`` is the pending token);
* :meth:`TreeDrafter.accepted` keeps the entries of the accepted path's fed prefix
  (:func:`~decoders.common.kv_cache.keep_path`) and stops drafting for the sample once the target emits an id
  the draft cannot embed;
* logits come from the decoder's ``draft_head`` (:func:`~decoders.common.heads.draft_head`): the draft's LM head
  over the ids the target can score, or with ``draft_vocab_size`` a reduced head over the most frequent ids only
  (FR-Spec, arXiv 2502.14856), so every distribution here is over the head's columns and
  :meth:`TreeDrafter.top` names the chosen columns' token ids. The tree's nodes are candidates the target
  verifies, so the head changes the tree, never the output.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from decoders.common.base import DraftingDecoder, draft_view, windowed
from decoders.common.driver import Verdict
from decoders.common.forward import new_cache
from decoders.common.kv_cache import keep_path
from decoders.common.tree import tree_rows


class TreeDrafter:
    """One sample's draft-model state for a layer-by-layer tree proposer (see the module docstring).

    Attributes:
        draftable: False once the sample holds an id the draft cannot embed (then the proposer drafts nothing).
        ctx_len: the draft cache's length before this step's tree nodes (the step's context, less ``offset``).
        window_offset: the prompt tokens the draft window leaves out (0: it reads the whole prompt).
        fed: node key -> its position among the nodes fed to the draft this step.
    """

    def __init__(self, decoder: DraftingDecoder):
        self.decoder = decoder  # its draft model, shared vocabulary and sampling settings
        self.head = decoder.draft_head  # built once per decoder (a reduced head copies its rows of the LM head)
        self.cache = new_cache(decoder.draft_model)
        self.cached = 0
        self.device = decoder.draft_model.get_input_embeddings().weight.device
        self.dtype = decoder.draft_model.dtype  # once: transformers' ``dtype`` walks the parameters on every read
        self.draftable = True
        self.ctx_len = 0
        self.window_offset = 0
        self.fed: dict[int, int] = {}
        self._lines: list[list[int]] = []  # each fed node's ancestor-or-self positions among the fed, root first

    def start(self, prompt: list[int]) -> None:
        view, self.window_offset = draft_view(prompt, self.decoder.draft_window)
        self.draftable = self.decoder.vocab.can_embed(view)  # what the draft reads (as the speculative chain)

    @property
    def offset(self) -> int:
        """Context tokens missing from the draft cache: the window's offset once the draft has read the prompt
        (``cached > 0``), 0 before (its cache then holds ``context[:0]``)."""
        return self.window_offset if self.cached else 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's distributions, ``torch.FloatTensor`` of shape ``(m, columns)``, from the head's logits
        ``(m, columns)``: processed as the run samples (temperature, top-k, top-p), or a plain softmax when greedy.
        Column ``c`` is token ``head.token_ids(c)`` (the identity for the full head)."""
        sampling = self.decoder.sampling
        logits = logits.float()
        return torch.softmax(logits, -1) if sampling.greedy else sampling.probs(logits)

    def top(self, probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``min(k, columns)`` most likely tokens of each row of ``probs`` (``(..., columns)``, from
        :meth:`probs`): ``(values, token_ids)``, each of shape ``(..., min(k, columns))``, by falling value."""
        values, columns = probs.topk(min(k, probs.shape[-1]), dim=-1)
        return values, self.head.token_ids(columns)

    def first_layer(self, context: list[int]) -> tuple[torch.Tensor, int]:
        """Catch the draft up on the context (the tokens it lacks, the pending token last) and start a step.

        Returns:
            ``(probs, fed)``: the draft's distribution after the pending token, ``torch.FloatTensor`` of shape
            ``(1, columns)`` (:meth:`probs`), and the number of tokens fed.
        """
        if self.cached == 0 and self.window_offset:  # the draft's prefill, through the window
            feed = windowed(context, self.window_offset)
        else:
            feed = context[self.cached:]
        logits = self.head.logits(torch.tensor([feed], device=self.device), self.cache, keep=1)
        self.cached = len(context)
        self.ctx_len = self.cached - self.offset
        self.fed, self._lines = {}, []
        return self.probs(logits), len(feed)

    def layer(self, keys: Sequence[int], tokens: Sequence[int], parent_keys: Sequence[int]) -> torch.Tensor:
        """Feed one layer of nodes in one draft forward, each attending to the context, its fed ancestors and
        itself.

        Args:
            keys: the proposer's key of each node (``>= 0``, new this step).
            tokens: each node's token id.
            parent_keys: each node's parent: a key fed earlier this step, or ``-1`` (the pending token).

        Returns:
            the draft's distribution after each node, ``torch.FloatTensor`` of shape ``(len(keys), columns)``.
        """
        start = len(self._lines)
        for key, parent in zip(keys, parent_keys):
            position = len(self._lines)
            self._lines.append([*self._lines[self.fed[parent]], position] if parent >= 0 else [position])
            self.fed[key] = position
        # Only the new nodes' rows: the earlier ones' never change (masks built incrementally).
        mask, pos = tree_rows(self._lines[start:], self.ctx_len, len(self._lines),
                              dtype=self.dtype, device=self.device)
        logits = self.head.logits(torch.tensor([list(tokens)], device=self.device), self.cache,
                                  position_ids=pos, attention_mask=mask, keep=len(tokens))
        return self.probs(logits)

    def rename(self, key: int, new_key: int) -> None:
        """Give a node fed this step a new key (one fed before its proposer knew the key it would keep).

        Raises:
            KeyError: if ``key`` was not fed this step.
        """
        self.fed[new_key] = self.fed.pop(key)

    def accepted(self, verdict: Verdict, path_keys: Iterable[int | None]) -> None:
        """Keep the draft's KV entries of the accepted path's nodes that were fed (its longest fed prefix).

        Args:
            verdict: the target's verdict on the step.
            path_keys: the key of each kept node of the accepted path, root to leaf; ``None`` for a node that was
                never fed to the draft (e.g. a copied one).
        """
        if self.draftable and not self.decoder.vocab.can_embed(verdict.emitted):
            self.draftable = False
        if not self.fed:  # no tree node was fed to the draft (the draft cache ends at the step's context)
            return
        kept: list[int] = []
        for key in path_keys:
            if key is None or key not in self.fed:
                break
            kept.append(self.ctx_len + self.fed[key])
        keep_path(self.cache, self.ctx_len, kept)
        self.cached = self.offset + self.ctx_len + len(kept)
        self.fed, self._lines = {}, []
