"""Draft trees: OPT-Tree's adaptive tree (Wang et al. 2024, arXiv 2406.17276, TACL 2025), cost-aware and hybrid.

OPT-Tree grows a token tree with the draft model, one draft forward per layer, and verifies the tree that
maximises the expected acceptance length in one target forward:

* a node's *value* is the product of the draft's probabilities along its path from the pending token (an
  estimate of the probability that the target accepts the whole path); a tree's expected acceptance length
  ``E(A)`` is the sum of its nodes' values (plus the bonus token). Values fall along every path, so the
  ``num_nodes`` nodes of highest value always form a valid tree;
* layer 1 is the draft's top ``num_nodes`` tokens after the context. Each further layer is ONE draft forward
  over the current frontier with tree attention; each frontier node's top ``num_nodes`` children get value
  ``parent value * draft probability``;
* growth stops when the gain in ``E(A)`` of the best ``num_nodes``-node tree (the sum of the top
  ``num_nodes`` values over all layers) falls below ``threshold``, or at ``max_depth`` layers;
* the verified tree is the top ``num_nodes`` nodes by value. The paper keeps the global top ``num_nodes`` of a
  new layer as its frontier; this implementation expands only those among them that are also in the top
  ``num_nodes`` overall -- the others' children can never be selected (a child's value is at most its parent's),
  so the verified tree and the stopping point are the paper's, for fewer draft tokens.

The draft's KV entries of the accepted path are kept (:func:`~decoders.common.kv_cache.keep_path`), not
recomputed. Greedy: the longest accepted path (:func:`~decoders.common.verify.tree_verify`). Sampling: the
tree's nodes are deterministic candidates (the draft's most likely tokens, not draws), verified by SpecInfer's
multi-candidate rule (:func:`~decoders.common.verify.multi_candidate_tree_verify`): lossless.

Beyond the paper (each off by default):

* ``cost_aware``: the tree size and depth follow the machine. A :class:`~decoders.common.cost.ForwardCost`
  measured on the models in use (target forward time for ``k`` tokens, draft forward time for ``m`` frontier
  tokens) gives the expected time of a step; growth continues while the best tree's expected tokens per second
  ``(1 + E(A)) / (t_draft + t_target(1 + n))`` rises, only the nodes of the tree of best rate are expanded, and the
  verified tree is cut to the size ``n <= num_nodes`` that maximises it. OPT-Tree's ``threshold`` ignores that
  ``k`` tokens are nearly free on a GPU (or a CPU with bf16 units) and not in float32 on a CPU.
* ``copy_tokens`` (the *hybrid tree*): before the draft model runs, the continuation that followed the most recent
  earlier occurrence of the context's last n-gram (prompt lookup's match, up to ``min(copy_tokens, num_nodes)``
  tokens) is put in the tree as a chain under the pending token (origin ``copy``, value 1 per node: always
  verified). ``copy_min_match`` is the shortest suffix that must recur (1: a single recurring token is enough;
  3: only a recurring 3-gram, fewer but surer copies). With ``draft_on_copy=False`` a step with a match runs no
  draft forward at all (the copy is the whole
  tree); otherwise the draft's tree is grown within the budget the copy leaves (``num_nodes - len(copy)`` nodes)
  and merged with it (a draft node equal to a copy node is the same node). ``num_nodes`` bounds every step's
  verified tree, copy included. With ``cost_aware`` too (the *cost-aware hybrid*), the measured costs decide:
  a copied node at depth ``i`` is worth ``q^i``, ``q`` this sample's rate of accepted copied tokens so far (copied
  tokens accepted / (those + copy steps cut short), from 1/2); a copy step runs the draft only while the draft's own
  trees have been expected to beat the copy alone (the running mean of the best rate the draft's tree reached on
  steps without a copy, against ``(1 + E(copy)) / t_target(1 + len(copy))``), and the draft's tree grows, is
  expanded and cut by the rate of the whole tree, copy included (its verified tokens and its expected accept
  length; a draft node on the copy's path adds neither).
* ``guess_tokens`` (*guessed chains*: several levels per draft forward): with each layer's frontier the draft is
  also fed a chain of up to ``guess_tokens`` tokens under the best frontier node: what followed the most recent
  earlier occurrence of the last n-gram of the context + that node's path (the copy's match). The forward gives
  each guessed token's distribution at once; a guessed token that is among its parent's top ``num_nodes`` children
  becomes that candidate (the same value the layer-by-layer tree would give it), already expanded, so its children
  join the candidates in the same forward; the chain stops at the first token the draft does not rank there (fed,
  never a candidate). Where the context repeats, one forward grows the tree several levels: a depth-``D`` tree in
  fewer than ``D`` sequential draft forwards, at the cost of feeding the guessed tokens (cheap where a
  multi-token forward costs about one token's: a GPU, a CPU with bf16 units).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from decoders.common.base import DraftingDecoder
from decoders.common.cost import ForwardCost
from decoders.common.driver import DraftCounts, DraftTree, Verdict
from decoders.common.forward import max_depth_after
from decoders.common.heads import draft_head
from decoders.common.ngram_pool import SuffixIndex
from decoders.common.stopping import truncate_at_stop
from decoders.common.tree import depth_first
from decoders.common.tree_draft import TreeDrafter
from decoders.types import StepRecord
from decoders.settings import OptTreeSettings

#: Longest suffix n-gram the hybrid tree looks up in the context (prompt lookup's ``max_ngram_size``).
COPY_NGRAM = 3
#: Draft keys of guessed nodes before they become candidates (above any candidate index of a step).
GUESS_KEY = 1 << 40


class OptTreeDecoder(DraftingDecoder, settings=OptTreeSettings, uses_draft=True):
    """OPT-Tree speculative decoding with a draft model (greedy, or lossless sampling); optionally cost-aware
    and hybrid (see the module docstring).

    Per-step statistics (:class:`~decoders.types.StepRecord`): ``drafted`` = nodes verified (the tree size),
    ``accepted`` = accepted nodes kept, ``draft_forwards`` = tree layers grown (the first also catches the draft up
    on the tokens the target accepted, so the draft's prompt prefill is charged to the first step),
    ``source = {"draft": a, "bonus": 0 or 1}`` (plus ``"copy"`` with ``copy_tokens``). ``extra`` holds the mean
    tree depth and size, the draft forwards and accepted tokens per step, the cost points when cost-aware, and
    with ``guess_tokens`` the guessed tokens fed, kept as candidates and verified per step.

    Args:
        target_model: the model whose greedy output (or sampling distribution) is reproduced.
        draft_model: a smaller model with the same tokenizer (required).
        num_nodes: the node budget ``n >= 1``: nodes verified per step, the copied branch included (the pending
            token not included).
        threshold: ``0 <= delta <= 1``; growth stops when a layer adds less than ``delta`` to the best tree's
            ``E(A)`` (a layer's nodes are distinct paths, so their values sum to at most 1).
        max_depth: ``>= 1`` layers at most (so the tree's depth is at most ``max_depth``).
        cost_aware: grow, expand and cut the tree by measured forward costs instead of ``threshold``.
        copy_tokens: ``>= 0``; 0 = off. Otherwise the hybrid tree's copied branch holds up to this many tokens
            (and at most ``num_nodes``).
        draft_on_copy: with ``copy_tokens``, also grow the draft model's tree on steps where a copy was found
            (with ``cost_aware``: where the measured costs expect it to pay, see the module docstring).
        copy_min_match: with ``copy_tokens``, ``1 <= m <= 3``: copy only when the context's last ``n >= m`` tokens
            occurred earlier (``n`` = 3 tried first).
        guess_tokens: ``>= 0``; 0 = off. Otherwise each draft forward also feeds up to this many guessed tokens
            (a copy from the context) under the best frontier node, kept as far as the draft ranks them.
        draft_vocab_size: ``>= 0``; 0 = off. Otherwise the draft ranks only the ``draft_vocab_size`` lowest ids
            (BPE merge rank, :func:`~decoders.common.heads.merge_rank_ids`) plus the EOS ids, through a reduced LM
            head (FR-Spec, arXiv 2502.14856): cheaper draft forwards, tree nodes only from those ids. The
            cost-aware rule times the draft with its full head (an upper bound on the reduced head's cost).
        draft_window: ``>= 0``; 0 = off. Otherwise the draft reads only the prompt's first 4 and last
            ``draft_window`` tokens (:func:`~decoders.common.base.draft_view`): a shorter draft prefill on long
            prompts, other drafts, the same output.
        eos_token_ids: ids that end generation; an EOS node is never expanded.
        sampling: greedy (the default) or the sampling settings of the run (applied to the draft's values too).

    Raises:
        ValueError: if the draft model is missing, a setting is out of range, or either model's KV cache cannot be
            rolled back (:func:`~decoders.common.kv_cache.check_rollback`).
    """

    name = "opt_tree"
    draft_shape = "tree"
    supports_sampling = True
    supports_batch = True

    def _build(self) -> None:
        self.threshold = float(self.threshold)
        self.draft_head = draft_head(self.draft_model, self.draft_vocab_size, self.vocab.draft, self.eos_token_ids)
        # Measured here, at construction, so no timed cell pays for it.
        self.cost = (ForwardCost.measure(self.target_model, self.draft_model, max_tokens=self.num_nodes + 1)
                     if self.cost_aware else None)

    def proposer(self) -> "_TreeGrower":
        return _TreeGrower(self)


class _TreeGrower:
    """The OPT-Tree proposer for one sample: the draft's side (its cache, the nodes fed, the accepted path's KV
    kept) is a :class:`~decoders.common.tree_draft.TreeDrafter`, whose node keys are candidate indices."""

    def __init__(self, decoder: OptTreeDecoder):
        self.decoder = decoder  # its settings, draft model and measured forward costs
        self.draft = TreeDrafter(decoder)
        self.copier = SuffixIndex(COPY_NGRAM)  # renewed by start
        self.budget = decoder.num_nodes  # draft nodes of this step's tree (num_nodes less the copied branch)
        # This step's state, set by propose and read by accepted:
        self.chosen: list[int] = []      # draft node (verified order) -> candidate index
        self.node_of: list[int] = []     # draft node -> index in the verified tree (copy nodes merged)
        self._last_nodes: list[tuple[int, int, float, int]] = []  # draft nodes: token, parent, value, depth
        self._guessed: set[int] = set()  # candidates fed within a guessed chain this step (expanded already)
        self._guess_fed = 0  # guessed tokens fed this step
        self._copy: list[int] = []  # this step's copied chain
        self._copy_value = 0.0      # its expected accepted length (cost-aware hybrid; 0 otherwise)
        self._last_rate = 0.0       # the best expected tokens/s of the tree just grown (cost-aware)
        # The cost-aware hybrid's history for one sample: copied tokens accepted, copy steps cut short, and the
        # running mean of the best rate the draft's tree reached on steps without a copy (None: none yet).
        self._copy_hits = self._copy_misses = self._draft_steps = 0
        self._draft_rate: float | None = None

    def start(self, prompt: list[int]) -> None:
        self.draft.start(prompt)
        self.copier = SuffixIndex(COPY_NGRAM)  # the hybrid tree's copy (prompt lookup's match), kept incrementally
        self._copy_hits = self._copy_misses = self._draft_steps = 0
        self._draft_rate = None

    # -------------------------------------------------------------------------------------------------------
    def propose(self, context: list[int], remaining: int, generator: torch.Generator | None) -> DraftTree:
        d = self.decoder
        room = max(0, min(remaining - 1, max_depth_after(d.target_model, len(context) - 1)))
        depth_limit = min(d.max_depth, room)
        copy: list[int] = []
        if d.copy_tokens and room:
            length = min(d.copy_tokens, room, d.num_nodes)  # the copy is verified within the node budget
            copy = truncate_at_stop(self.copier.candidates(context, length, d.copy_min_match), d.eos_token_ids, length)
        if d.guess_tokens:
            self.copier.candidates(context, 0)  # index the context for the guessed chains (incremental)
        self.budget = d.num_nodes - len(copy)  # draft nodes this step: the budget the copy leaves
        self._guessed, self._guess_fed = set(), 0
        self._copy, self._copy_value = copy, (self._expected_copy(len(copy)) if d.cost_aware else 0.0)
        nodes: list[tuple[int, int, float, int]] = []  # (token, parent, value, depth)
        forwards = fed_tokens = 0
        drafted = bool(depth_limit and self.draft.draftable and self.budget and (not copy or self._draft_on_copy()))
        if drafted:
            nodes, forwards, fed_tokens = self._grow(context, depth_limit)
            if d.cost_aware and not copy:  # what the draft's own trees are expected to give, for later copy steps
                self._draft_steps += 1
                mean = self._draft_rate or 0.0
                self._draft_rate = mean + (self._last_rate - mean) / self._draft_steps
        tokens, parents, origins = self._merge(copy, nodes)
        labels = ("draft", "copy") if d.copy_tokens else ("draft",)
        depth = max((self._depths(parents) or [0])) + (1 if parents else 0)
        stats = {"tree_depth": depth, "copy_steps": bool(copy), "tree_nodes": len(tokens),
                 "copy_draft_steps": bool(copy) and drafted}
        if d.guess_tokens:
            stats.update(guess_fed=self._guess_fed, guess_kept=len(self._guessed),
                         guess_verified=sum(1 for i in self.chosen if i in self._guessed))
        return DraftTree(tokens=tokens, parents=parents,
                         counts=DraftCounts(origins=origins, labels=labels, draft_forwards=forwards,
                                            draft_tokens_fed=fed_tokens, stats=stats))

    def _expected_copy(self, length: int) -> float:
        """Expected accepted length of a copied chain of ``length`` tokens: ``q + q^2 + ... + q^length``, ``q`` the
        sample's rate of accepted copied tokens so far (a Beta(1, 1) prior: 1/2 before any copy step)."""
        q = (self._copy_hits + 1) / (self._copy_hits + self._copy_misses + 2)
        return sum(q ** i for i in range(1, length + 1))

    def _draft_on_copy(self) -> bool:
        """Whether a step with a copy also grows the draft's tree: ``draft_on_copy``; cost-aware, only while the
        draft's trees on steps without a copy were expected to beat the copy alone (or none was grown yet)."""
        d = self.decoder
        if not d.draft_on_copy or not d.cost_aware or self._draft_rate is None:
            return d.draft_on_copy
        return self._draft_rate > (1 + self._copy_value) / d.cost.target_time(1 + len(self._copy))

    @staticmethod
    def _depths(parents: Sequence[int]) -> list[int]:
        depth: list[int] = []
        for p in parents:
            depth.append(0 if p < 0 else depth[p] + 1)
        return depth

    def _grow(self, context: list[int], depth_limit: int) -> tuple[list[tuple[int, int, float, int]], int, int]:
        """Grow the tree layer by layer; returns the selected nodes (topological order), forwards, tokens fed."""
        d, n = self.decoder, self.budget
        probs, fed_tokens = self.draft.first_layer(context)  # (1, V)
        forwards = 1
        top_p, top_i = self.draft.top(probs[0], n)
        # All candidate nodes so far: token, parent, value, depth.
        cand: list[tuple[int, int, float, int]] = [(t, -1, v, 0) for t, v in zip(top_i.tolist(), top_p.tolist())]
        best = self._select(cand)
        gain_ref = sum(cand[i][2] for i in best)
        spent = d.cost.draft_time(fed_tokens) if d.cost_aware else 0.0  # expected draft seconds so far
        rate = self._rate(cand, best, spent)
        frontier = self._frontier(cand, best, 0, spent, depth_limit)
        while frontier:  # each forward deepens the frontier by >= 1 level, so at most depth_limit - 1 of them
            guess = self._guess(context, cand, frontier[0], depth_limit) if d.guess_tokens else []
            first_new = len(cand)
            # One draft forward over the frontier (and a guessed chain under its best node), tree attention over
            # every node fed this step.
            guess_keys = [GUESS_KEY + first_new + j for j in range(len(guess))]  # renamed once they are candidates
            probs = self.draft.layer([*frontier, *guess_keys], [*(cand[i][0] for i in frontier), *guess],
                                     [*(cand[i][1] for i in frontier), *[frontier[0], *guess_keys][: len(guess)]])
            forwards += 1
            fed_tokens += len(frontier) + len(guess)
            self._guess_fed += len(guess)
            top_p, top_i = self.draft.top(probs, n)  # (F + G, k): values and token ids
            k = top_i.shape[-1]
            if guess:
                self._add_layer_with_guess(cand, frontier, guess, guess_keys, top_p, top_i)
            else:
                parent_values = torch.tensor([cand[i][2] for i in frontier], dtype=top_p.dtype, device=top_p.device)
                values = (top_p * parent_values[:, None]).flatten()
                # Only the best n of the new layer can matter (the paper's frontier); keep those.
                top = values.topk(min(n, values.numel()))
                for j, token, value in zip(top.indices.tolist(), top_i.flatten()[top.indices].tolist(),
                                           top.values.tolist()):
                    cand.append((token, frontier[j // k], value, cand[frontier[j // k]][3] + 1))
            # The top n of all candidates is the top n of the previous top n and the new layer: values never
            # change, so a candidate outside the top n has n better ones for good.
            new_best = self._select(cand, [*best, *range(first_new, len(cand))])
            gain = sum(cand[i][2] for i in new_best) - gain_ref
            if d.cost_aware:
                spent += d.cost.draft_time(len(frontier) + len(guess))
                new_rate = self._rate(cand, new_best, spent)
                if new_rate <= rate:
                    del cand[first_new:]
                    break
                rate = new_rate
            elif gain < d.threshold:
                best = new_best
                gain_ref += gain
                break
            best, gain_ref = new_best, gain_ref + gain
            frontier = self._frontier(cand, best, first_new, spent, depth_limit)
        if d.cost_aware:  # `best` is the top n of `cand` on every way out of the loop
            best = best[: self._best_size(cand, best, spent)]
            self._last_rate = rate
        # Layer by layer in value order, then depth first (siblings in that order): the best path leads the tree.
        chosen = sorted(best, key=lambda i: (cand[i][3], -cand[i][2]))
        index = {i: j for j, i in enumerate(chosen)}
        chosen = [chosen[j] for j in depth_first([index[cand[i][1]] if cand[i][1] >= 0 else -1 for i in chosen])]
        index = {i: j for j, i in enumerate(chosen)}
        self.chosen = chosen
        self._last_nodes = [(cand[i][0], index[cand[i][1]] if cand[i][1] >= 0 else -1, cand[i][2], cand[i][3])
                            for i in chosen]
        return self._last_nodes, forwards, fed_tokens

    def _guess(self, context: list[int], cand: list[tuple[int, int, float, int]], node: int, depth_limit: int
               ) -> list[int]:
        """The chain fed under ``node`` with the frontier (``guess_tokens``): what followed the most recent earlier
        occurrence of the last n-gram of ``context`` + ``node``'s path, cut before an EOS and so that every fed
        node's children stay within ``depth_limit`` levels."""
        path: list[int] = []
        i = node
        while i >= 0:
            path.append(cand[i][0])
            i = cand[i][1]
        tail = [*context[-COPY_NGRAM:], *reversed(path)]
        room = min(self.decoder.guess_tokens, depth_limit - 2 - cand[node][3])
        guess = self.copier.continuation(tail, room) if room > 0 else []
        eos = [j for j, t in enumerate(guess) if t in self.decoder.eos_token_ids]
        return guess[: eos[0]] if eos else guess  # an EOS node is never expanded, so never fed

    def _add_layer_with_guess(self, cand: list[tuple[int, int, float, int]], frontier: list[int], guess: list[int],
                              guess_keys: list[int], top_p: torch.Tensor, top_i: torch.Tensor) -> None:
        """Add a forward's new candidates when a guessed chain was fed under ``frontier[0]``: the frontier's
        children (rows ``0 .. F-1`` of ``top_p`` / ``top_i``, each ``(F + G, k)``) and, for each guessed token that
        is among its parent's top ``k`` children, that child's own children (row ``F + j``: the guessed node is
        expanded already); the chain stops at the first guess the draft does not rank there. Of all these, the best
        ``num_nodes`` by value are kept, as for a plain layer (a child never outranks its parent, so the kept ones
        form a tree; ties to a parent dropped)."""
        f, k, n = len(frontier), top_i.shape[-1], self.budget
        parent_value = [cand[i][2] for i in frontier] + [-1.0] * len(guess)  # -1: a row whose guess was not ranked
        parent_rows = [0, *range(f, f + len(guess) - 1)]  # the row ranking each guessed token
        ranked_i, ranked_p = top_i[parent_rows].tolist(), top_p[parent_rows].tolist()
        at: dict[int, int] = {}  # flat index (row * k + rank) of a ranked guess -> its guess position
        for j, token in enumerate(guess):
            if token not in ranked_i[j]:
                break
            rank = ranked_i[j].index(token)
            parent_value[f + j] = (parent_value[0] if j == 0 else parent_value[f + j - 1]) * ranked_p[j][rank]
            at[parent_rows[j] * k + rank] = j
        values = (top_p * torch.tensor(parent_value, dtype=top_p.dtype, device=top_p.device)[:, None]).flatten()
        top = values.topk(min(n, values.numel()))
        kept = sorted((flat, value) for flat, value in zip(top.indices.tolist(), top.values.tolist()) if value >= 0)
        tokens = top_i.flatten()[[flat for flat, _ in kept]].tolist() if kept else []
        row_node = list(frontier) + [-1] * len(guess)  # row -> the candidate it expands (-1: not a candidate)
        for (flat, value), token in zip(kept, tokens):  # ascending flat index: a parent's row precedes its children
            parent = row_node[flat // k]
            if parent < 0:  # the guessed parent itself was not kept (a tie): its children go too
                continue
            cand.append((token, parent, value, cand[parent][3] + 1))
            if flat in at:  # a guessed node: fed already, its row gives its children
                j = at[flat]
                row_node[f + j] = len(cand) - 1
                self.draft.rename(guess_keys[j], len(cand) - 1)
                self._guessed.add(len(cand) - 1)

    def _frontier(self, cand: list[tuple[int, int, float, int]], best: list[int], first: int, spent: float,
                  depth_limit: int) -> list[int]:
        """The nodes to expand next: the newest forward's nodes (index ``>= first``) among the selected ones that
        were not fed already (a guessed chain's), never an EOS node, none whose children would exceed
        ``depth_limit`` levels. Selected = the top ``num_nodes``; cost-aware: the top ``m`` only, ``m`` the size
        that maximises the expected tokens per second, so the draft is not run over nodes the step would not
        verify. In value order (the first is the best)."""
        if self.decoder.cost_aware:
            best = best[: self._best_size(cand, best, spent)]
        return [i for i in best if i >= first and i not in self._guessed and cand[i][3] <= depth_limit - 2
                and cand[i][0] not in self.decoder.eos_token_ids]

    def _select(self, cand: list[tuple[int, int, float, int]], among: Sequence[int] | None = None) -> list[int]:
        """Indices of the top ``budget`` candidates (of ``among``, default all) by value (ties: shallower first,
        so parents precede; then the older candidate)."""
        order = sorted(range(len(cand)) if among is None else among, key=lambda i: (-cand[i][2], cand[i][3], i))
        return order[: self.budget]

    def _rates(self, cand: list[tuple[int, int, float, int]], best: list[int], spent: float) -> list[float]:
        """Expected tokens per second of a step verifying the first ``m`` of ``best`` (``m = 0 .. len(best)``):
        ``(1 + E(copy) + sum of their values) / (draft seconds spent + target seconds for 1 + len(copy) + m
        tokens)``, except that a node on the copy's path (merged into it) adds neither its value nor a token
        (without a copy: ``E(copy) = len(copy) = 0``)."""
        cost, rates = self.decoder.cost, []
        total, tokens = 1.0 + self._copy_value, 1 + len(self._copy)
        merged = self._on_copy(cand, best) if self._copy else set()
        for m in range(len(best) + 1):
            if m and best[m - 1] not in merged:
                total += cand[best[m - 1]][2]
                tokens += 1
            rates.append(total / (spent + cost.target_time(tokens)))
        return rates

    def _on_copy(self, cand: list[tuple[int, int, float, int]], nodes: Sequence[int]) -> set[int]:
        """The candidates among ``nodes`` whose path from the pending token is a prefix of this step's copy (the
        verified tree merges them into the copy's nodes, :meth:`_merge`)."""
        copy, on = self._copy, {}

        def follows(i: int) -> bool:
            if i not in on:
                token, parent, _, depth = cand[i]
                on[i] = depth < len(copy) and token == copy[depth] and (parent < 0 or follows(parent))
            return on[i]

        return {i for i in nodes if follows(i)}

    def _rate(self, cand: list[tuple[int, int, float, int]], best: list[int], spent: float) -> float:
        return max(self._rates(cand, best, spent)) if self.decoder.cost_aware else 0.0

    def _best_size(self, cand: list[tuple[int, int, float, int]], best: list[int], spent: float) -> int:
        rates = self._rates(cand, best, spent)
        return max(range(len(rates)), key=rates.__getitem__)

    def _merge(self, copy: list[int], nodes: list[tuple[int, int, float, int]]
               ) -> tuple[list[int], list[int], list[str]]:
        """The verified tree: the copied chain first (origin ``copy``), then the draft's nodes (``draft``), a draft
        node equal to a copy node (same token under the same parent) merged into it."""
        tokens, parents, origins = list(copy), list(range(-1, len(copy) - 1)), ["copy"] * len(copy)
        self.node_of = []
        for token, parent, _, depth in nodes:
            tree_parent = self.node_of[parent] if parent >= 0 else -1
            same = -1
            if depth < len(copy) and copy[depth] == token and tree_parent == depth - 1:
                same = depth  # the copy's node at this depth, under the same (copy) parent
            if same >= 0:
                self.node_of.append(same)
                continue
            self.node_of.append(len(tokens))
            tokens.append(token)
            parents.append(tree_parent)
            origins.append("draft")
        return tokens, parents, origins

    # -------------------------------------------------------------------------------------------------------
    def accepted(self, context: list[int], tree: DraftTree, verdict: Verdict) -> None:
        """Keep the draft's KV entries of the accepted nodes it was fed (:meth:`TreeDrafter.accepted`; a copied
        node is not a candidate)."""
        tree_to_draft = {t: i for i, t in enumerate(self.node_of)}
        self.draft.accepted(verdict, (self.chosen[tree_to_draft[k]] if k in tree_to_draft else None
                                      for k in verdict.path[: verdict.kept]))
        if self._copy:  # the copy's nodes lead the verified tree (indices 0 .. len - 1)
            hits = sum(1 for k in verdict.path[: verdict.kept] if k < len(self._copy))
            self._copy_hits += hits
            self._copy_misses += hits < len(self._copy)

    def extra(self, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        d, n = self.decoder, len(steps)
        out: dict[str, Any] = {
            "num_nodes": d.num_nodes,
            "threshold": d.threshold,
            "max_depth": d.max_depth,
            "tree_depth_per_step": stats.get("tree_depth", 0) / n if n else 0.0,
            "tree_nodes_per_step": stats.get("tree_nodes", 0) / n if n else 0.0,
        }
        if d.cost_aware:
            out["cost_aware"] = True
            out["cost_points"] = d.cost.describe() if d.cost else ""
        if d.draft_vocab_size:
            out["draft_vocab_size"] = d.draft_vocab_size
        out["draft_window_cut"] = self.draft.window_offset
        if d.guess_tokens:
            out.update(guess_tokens=d.guess_tokens,
                       **{f"{key}_per_step": stats.get(key, 0) / n if n else 0.0
                          for key in ("guess_fed", "guess_kept", "guess_verified")})
        if d.copy_tokens:
            out.update(copy_tokens=d.copy_tokens, draft_on_copy=d.draft_on_copy, copy_min_match=d.copy_min_match,
                       copy_step_rate=stats.get("copy_steps", 0) / n if n else 0.0,
                       copy_draft_rate=(stats.get("copy_draft_steps", 0) / stats["copy_steps"]
                                        if stats.get("copy_steps") else 0.0))
        return out
