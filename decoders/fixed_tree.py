"""Fixed draft trees: a static tree shape, grown by the draft model one layer per draft forward.

EAGLE (Li et al. 2024, arXiv 2401.15077) and Medusa (Cai et al. 2024, arXiv 2401.10774) verify a token tree of a
fixed shape, their "tree choices"; OPT-Tree (Wang et al. 2024, arXiv 2406.17276) compares its adaptive trees with
such fixed shapes grown by the same draft model. A shape is a list of paths; a path lists, for each depth, the rank
of the node's token among the draft's most likely tokens after its parent: ``[0]`` is the draft's most likely
first token, ``[1]`` its runner-up, ``[0, 1]`` the runner-up after ``[0]``. Every path's parent (the path less its
last rank) is a path too (:func:`decoders.settings.tree_shape_problem`).

A step, with the draft model and verification of :mod:`decoders.opt_tree`:

* layer 1: the draft catches up on the context in one forward; the depth-1 nodes take its top tokens at their ranks;
* each further layer: ONE draft forward over the previous layer's nodes that have children in the shape (tree
  attention over every node fed this step); each child takes its rank among its parent's top tokens;
* the shape is cut at the token budget and the model's position limit, and an EOS node is never expanded (its
  subtree is dropped);
* greedy: the longest accepted path (:func:`~decoders.common.verify.tree_verify`); sampling: the nodes are
  deterministic candidates verified by SpecInfer's multi-candidate rule
  (:func:`~decoders.common.verify.multi_candidate_tree_verify`): lossless.

Greedy, the chain ``[[0], [0, 0], [0, 0, 0]]`` is speculative decoding with ``gamma = 3``: the same tokens and the
same accepted counts per step (``tests/test_fixed_tree.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from decoders.common.base import DraftingDecoder
from decoders.common.driver import DraftCounts, DraftTree, Verdict
from decoders.common.forward import max_depth_after
from decoders.common.heads import draft_head
from decoders.common.tree import depth_first
from decoders.common.tree_draft import TreeDrafter
from decoders.settings import FixedTreeSettings, tree_levels, tree_shape_problem
from decoders.types import StepRecord


@dataclass(frozen=True)
class TreeShape:
    """A validated shape, its nodes in breadth-first order (by depth, then by path).

    Attributes:
        paths: each node's path of ranks.
        parent: each node's parent (an index into the nodes), ``-1`` at depth 1.
        children: ``parent index -> ((rank, child index), ...)``, by rank; key ``-1`` for the depth-1 nodes.
        depth: the deepest path's length.
    """

    paths: tuple[tuple[int, ...], ...]
    parent: tuple[int, ...]
    children: dict[int, tuple[tuple[int, int], ...]]
    depth: int

    @staticmethod
    def of(paths: Sequence[Sequence[int]]) -> "TreeShape":
        """The shape of ``paths`` (a list of lists of ranks, in any order).

        Raises:
            ValueError: ``paths`` is not a tree shape (:func:`decoders.settings.tree_shape_problem`).
        """
        problem = tree_shape_problem(paths)
        if problem:
            raise ValueError(f"paths: {problem}")
        ordered = tuple(sorted((tuple(int(r) for r in p) for p in paths), key=lambda p: (len(p), p)))
        index = {p: i for i, p in enumerate(ordered)}
        parent = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in ordered)
        children: dict[int, list[tuple[int, int]]] = {}
        for i, p in enumerate(ordered):
            children.setdefault(parent[i], []).append((p[-1], i))
        return TreeShape(ordered, parent, {k: tuple(sorted(v)) for k, v in children.items()},
                         max(len(p) for p in ordered))

    @property
    def levels(self) -> list[int]:
        """Nodes per depth, from depth 1 (:func:`decoders.settings.tree_levels`)."""
        return tree_levels(self.paths)


class FixedTreeDecoder(DraftingDecoder, settings=FixedTreeSettings, uses_draft=True):
    """Speculative decoding with a fixed draft tree grown by a draft model (greedy, or lossless sampling); see the
    module docstring.

    Per-step statistics (:class:`~decoders.types.StepRecord`): ``drafted`` = nodes verified (the shape, less what
    the token budget, the position limit and EOS nodes cut), ``accepted`` = accepted nodes kept,
    ``draft_forwards`` = tree layers grown (the first also catches the draft up on the tokens the target accepted,
    so the draft's prompt prefill is charged to the first step); ``source = {"draft": a, "bonus": 0 or 1}``.
    ``extra`` holds the shape's nodes per depth and the mean tree depth and size per step.

    Args:
        target_model: the model whose greedy output (or sampling distribution) is reproduced.
        draft_model: a smaller model with the same tokenizer (required).
        paths: the tree shape, one path of ranks per node (default: EAGLE-1's 25-node tree,
            :data:`decoders.settings.EAGLE1_TREE`).
        draft_vocab_size: ``>= 0``; 0 = off. Otherwise ranks are taken among the ``draft_vocab_size`` lowest ids
            (BPE merge rank) plus the EOS ids only, through a reduced LM head (as OPT-Tree's option).
        draft_window: ``>= 0``; 0 = off. Otherwise the draft reads only the prompt's first 4 and last
            ``draft_window`` tokens (:func:`~decoders.common.base.draft_view`): a shorter draft prefill on long
            prompts, other drafts, the same output.
        eos_token_ids: ids that end generation; an EOS node is never expanded.
        sampling: greedy (the default) or the sampling settings of the run (the draft's ranks are taken from its
            distributions processed as the run samples).

    Raises:
        ValueError: if the draft model is missing, ``paths`` is not a tree shape or ranks a token beyond the draft's
            vocabulary, or either model's KV cache cannot be rolled back
            (:func:`~decoders.common.kv_cache.check_rollback`).
    """

    name = "fixed_tree"
    draft_shape = "tree"
    supports_sampling = True
    supports_batch = True

    def _build(self) -> None:
        self.shape = TreeShape.of(self.paths)
        max_rank = max(p[-1] for p in self.shape.paths)
        self.draft_head = draft_head(self.draft_model, self.draft_vocab_size, self.vocab.draft, self.eos_token_ids)
        if max_rank >= self.draft_head.columns:
            reduced = (f": the {self.draft_vocab_size} lowest-ranked ids and the end-of-sequence ids"
                       if self.draft_vocab_size else "")
            raise ValueError(f"paths: rank {max_rank} is beyond the draft's vocabulary "
                             f"({self.draft_head.columns} ids{reduced})")

    def proposer(self) -> "_FixedTreeGrower":
        return _FixedTreeGrower(self)


class _FixedTreeGrower:
    """The fixed-tree proposer for one sample; the draft's side is a :class:`~decoders.common.tree_draft.TreeDrafter`
    whose node keys are the shape's node indices."""

    def __init__(self, decoder: FixedTreeDecoder):
        self.decoder = decoder
        self.draft = TreeDrafter(decoder)
        self.node_key: list[int] = []  # this step's tree node -> shape node index

    def start(self, prompt: list[int]) -> None:
        self.draft.start(prompt)

    def propose(self, context: list[int], remaining: int, generator: torch.Generator | None) -> DraftTree:
        d, shape = self.decoder, self.decoder.shape
        room = max(0, min(remaining - 1, max_depth_after(d.target_model, len(context) - 1)))
        depth_limit = min(shape.depth, room)
        tokens: list[int] = []
        parents: list[int] = []
        self.node_key = []
        forwards = fed = depth = 0
        if depth_limit and self.draft.draftable:
            rows, fed = self.draft.first_layer(context)  # (1, V): after the pending token
            forwards = 1
            position: dict[int, int] = {}  # shape node -> its index in this step's tree
            level = [-1]                   # the nodes whose children `rows` ranks (row j: level[j])
            for depth in range(1, depth_limit + 1):
                k = 1 + max(shape.children[node][-1][0] for node in level)  # children are sorted by rank
                top = self.draft.top(rows, k)[1].tolist()  # token ids by rank
                new: list[int] = []
                for j, node in enumerate(level):
                    for rank, child in shape.children[node]:
                        position[child] = len(tokens)
                        tokens.append(top[j][rank])
                        parents.append(position[node] if node >= 0 else -1)
                        self.node_key.append(child)
                        new.append(child)
                level = [c for c in new if c in shape.children and tokens[position[c]] not in d.eos_token_ids]
                if depth == depth_limit or not level:
                    break
                rows = self.draft.layer(level, [tokens[position[c]] for c in level],
                                        [shape.parent[c] for c in level])
                forwards += 1
                fed += len(level)
        order = depth_first(parents)  # the path through every first-ranked child leads the tree
        moved = {old: new for new, old in enumerate(order)}
        tokens = [tokens[i] for i in order]
        parents = [moved[parents[i]] if parents[i] >= 0 else -1 for i in order]
        self.node_key = [self.node_key[i] for i in order]
        return DraftTree(tokens=tokens, parents=parents,
                         counts=DraftCounts(labels=("draft",), draft_forwards=forwards, draft_tokens_fed=fed,
                                            stats={"tree_depth": depth if tokens else 0,
                                                   "tree_nodes": len(tokens)}))

    def accepted(self, context: list[int], tree: DraftTree, verdict: Verdict) -> None:
        self.draft.accepted(verdict, (self.node_key[k] for k in verdict.path[: verdict.kept]))

    def extra(self, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        n, shape = len(steps), self.decoder.shape
        out = {"draft_vocab_size": self.decoder.draft_vocab_size} if self.decoder.draft_vocab_size else {}
        out["draft_window_cut"] = self.draft.window_offset
        return {**out, "tree_levels": "+".join(map(str, shape.levels)),
                "tree_depth_per_step": stats.get("tree_depth", 0) / n if n else 0.0,
                "tree_nodes_per_step": stats.get("tree_nodes", 0) / n if n else 0.0}
