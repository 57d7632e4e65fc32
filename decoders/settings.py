"""Every decoder's settings, declared once (default, bound and meaning: :mod:`declare`), and every decoder
registered: one :func:`register_decoder` line each, at the end of this file.

A decoder's class names its settings class in its class line
(``class SpeculativeDecoder(DraftingDecoder, settings=SpeculativeSettings, uses_draft=True)``) and takes them as
keyword arguments checked against these declarations (:func:`declare.take`); :mod:`harness.config.schemas`
generates each registered decoder's Hydra schema (``base_decoder_<name>``) from its line; ``python run.py list
decoder=NAME`` prints the settings. Torch-free (a decoder's class is named by its import path, imported only when
built), so the command line is checked before torch is imported.

Adding a hyper-parameter: one field here. Adding a decoder: its settings class and one :func:`register_decoder`
line here, its class in ``decoders/<name>.py``, its ``conf/decoder/<name>.yaml`` (README, "Extending";
``tests/test_extending.py`` does it with nothing else changed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

from declare import Registered, at_least, between, one_of, register, setting

#: Lifetimes of an n-gram / phrase pool: ``sample`` = cold start (fresh per prompt), ``task`` = warm start.
POOL_SCOPES = ("sample", "task")
#: transformers' assisted-generation schedules (GenerationConfig.num_assistant_tokens_schedule).
ASSISTANT_SCHEDULES = ("constant", "heuristic", "heuristic_transient")


@dataclass
class VanillaSettings:
    """Greedy (or sampled) decoding with a KV cache: no settings of its own."""


@dataclass
class HFGreedySettings:
    """transformers' own ``generate()``: no settings of its own."""


# The draft's view of a long prompt, shared by speculative decoding, Ouroboros and the draft trees (declared once).
def _draft_window():
    return setting(0, at_least(0), "the draft reads only the prompt's first 4 and last N tokens: a shorter draft "
                                   "prefill (0: the whole prompt)")


@dataclass
class SpeculativeSettings:
    """Leviathan et al. 2023 (arXiv 2211.17192)."""

    gamma: int = setting(4, at_least(1), "draft tokens per step")
    draft_window: int = _draft_window()


@dataclass
class HFAssistedSettings:
    """transformers' assisted generation; null keeps transformers' default."""

    gamma: Optional[int] = setting(None, at_least(1), "num_assistant_tokens, draft tokens per step (null: 20)")
    num_assistant_tokens_schedule: Optional[str] = setting(
        None, one_of(*ASSISTANT_SCHEDULES), "how the draft length adapts (null: constant)")
    assistant_confidence_threshold: Optional[float] = setting(
        None, between(0.0, 1.0), "stop drafting below this draft confidence (null: 0.4; 0: off)")


# The n-gram pool's settings, shared by Lookahead and Ouroboros (declared once, placed in each class's order).
def _pool_scope():
    return setting("sample", one_of(*POOL_SCOPES), "pool lifetime: sample (cold start) or task (warm start)")


def _seed():
    return setting(0, at_least(0), "seed of the Jacobi window's initial tokens")


def _pool_from_prompt():
    return setting(False, None, "also seed the pool with the prompt's n-grams (not in the papers)")


# The draft's reduced LM head, shared by Ouroboros and the draft trees (declared once).
def _draft_vocab_size():
    return setting(0, at_least(0), "draft LM head cut to the lowest-merge-rank ids (0: off)")


@dataclass
class LookaheadSettings:
    """Lookahead decoding (Fu et al. 2024, arXiv 2402.02057)."""

    window_size: int = setting(5, at_least(1), "W, Jacobi window columns (n-grams harvested per step)")
    ngram_size: int = setting(4, at_least(2), "N, n-gram length; a step emits up to N tokens")
    guess_set_size: int = setting(5, at_least(0), "G, n-grams kept per key token and verified per step")
    pool_scope: str = _pool_scope()
    seed: int = _seed()
    pool_from_prompt: bool = _pool_from_prompt()


@dataclass
class OuroborosSettings:
    """Ouroboros (Zhao et al. 2024, arXiv 2402.13720), with cheaper-drafting options beyond the paper."""

    gamma: int = setting(6, at_least(1), "draft tokens per step (the trunk)")
    window_size: int = setting(4, at_least(1), "W, Jacobi window columns of the draft")
    ngram_size: int = setting(4, at_least(2), "N; phrases hold N - 1 tokens")
    guess_set_size: int = setting(4, at_least(0), "G, phrases kept per key token and verified per draft forward")
    topk: int = setting(3, at_least(0), "newest phrases appended as candidate suffixes (0: off)")
    pool_scope: str = _pool_scope()
    seed: int = _seed()
    pool_from_prompt: bool = _pool_from_prompt()
    free_draft_min_match: int = setting(0, at_least(0), "copy the trunk from the context when this many tokens "
                                                        "recur (0: off)")
    draft_vocab_size: int = _draft_vocab_size()
    stop_confidence: float = setting(0.0, between(0.0, 1.0), "stop drafting below this draft probability (0: off)")
    branch_confidence: float = setting(0.0, between(0.0, 1.0), "branch at trunk tokens below this draft "
                                                               "probability (0: off)")
    max_branches: int = setting(1, at_least(1), "most alternative branches per step")
    draft_window: int = _draft_window()


@dataclass
class OptTreeSettings:
    """OPT-Tree (Wang et al. 2024, arXiv 2406.17276), with a cost-aware rule and a hybrid copy branch."""

    num_nodes: int = setting(60, at_least(1), "node budget: tree nodes verified per step, a copied branch "
                                              "included (paper repo: 60)")
    threshold: float = setting(0.5, between(0.0, 1.0), "stop growing when a layer adds less to E(accept length) "
                                                       "(a layer adds at most 1)")
    max_depth: int = setting(10, at_least(1), "draft layers at most")
    cost_aware: bool = setting(False, None, "size the tree by measured forward costs instead of threshold")
    copy_tokens: int = setting(0, at_least(0), "hybrid tree: copied branch length, within num_nodes (0: off)")
    draft_on_copy: bool = setting(True, None, "hybrid tree: also grow the draft's tree when a copy is found")
    copy_min_match: int = setting(1, between(1, 3), "hybrid tree: copy only where the context's last n tokens "
                                                    "recur, n >= this (1-3; the longest is tried first)")
    guess_tokens: int = setting(0, at_least(0), "draft several levels per draft forward: up to this many tokens "
                                                "copied from the context fed under the best frontier node; the "
                                                "part the draft ranks in its top num_nodes joins the tree (0: off)")
    draft_vocab_size: int = _draft_vocab_size()
    draft_window: int = _draft_window()


#: EAGLE-1's default draft tree: ``mc_sim_7b_63`` in SafeAILab/EAGLE ``eagle/model/choices.py`` (25 nodes over 5
#: levels, despite the name; Medusa's tree of that name has 63 nodes). Each path lists the draft's rank of the
#: token chosen at each depth: ``(0,)`` its most likely first token, ``(0, 1)`` the runner-up after that one.
EAGLE1_TREE = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
               (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
               (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1))
#: The most nodes and levels a fixed tree may hold (far beyond any verify budget or draft depth that pays; a typo's
#: 10**6 nodes or a 1000-deep chain, one draft forward per level, is refused before models load).
MAX_TREE_NODES = 1024
MAX_TREE_DEPTH = 64


@dataclass
class FixedTreeSettings:
    """A static draft tree (EAGLE's and Medusa's tree choices; OPT-Tree's fixed-shape baselines)."""

    paths: List[List[int]] = setting(EAGLE1_TREE, None, "the tree: one path of draft ranks per node, e.g. "
                                                        "[[0],[1],[0,0]] (default: EAGLE-1's 25-node tree)")
    draft_vocab_size: int = _draft_vocab_size()
    draft_window: int = _draft_window()


def tree_levels(paths: Sequence[Sequence[int]]) -> list[int]:
    """A tree shape's nodes per depth, from depth 1 (``[4, 8, 8, 3, 2]`` for :data:`EAGLE1_TREE`): how tables
    name a shape."""
    depth = max((len(p) for p in paths), default=0)
    return [sum(len(p) == d for p in paths) for d in range(1, depth + 1)]


def tree_shape_problem(paths: Any) -> str | None:
    """Why ``paths`` is not a tree shape (one line), or None. A shape is a non-empty list of distinct, non-empty
    lists of ranks (integers ``>= 0``), at most :data:`MAX_TREE_NODES` paths of at most :data:`MAX_TREE_DEPTH`
    ranks, each path's parent (the path less its last rank) in the list too."""
    if isinstance(paths, (str, bytes, Mapping)) or not isinstance(paths, Sequence):
        return f"must be a list of paths (lists of ranks), e.g. [[0],[1],[0,0]]; got {type(paths).__name__}"
    if not paths:
        return "must list at least one path, e.g. [[0],[1],[0,0]]"
    if len(paths) > MAX_TREE_NODES:
        return f"{len(paths)} paths: at most {MAX_TREE_NODES}"
    seen: set[tuple[int, ...]] = set()
    for path in paths:
        if isinstance(path, (str, bytes, Mapping)) or not isinstance(path, Sequence):
            return f"path {path!r}: a path is a non-empty list of ranks (integers >= 0)"
        key = tuple(path)
        if not key or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in key):
            return f"path {list(key)}: a path is a non-empty list of ranks (integers >= 0)"
        if len(key) > MAX_TREE_DEPTH:
            return f"path of {len(key)} ranks: at most {MAX_TREE_DEPTH} levels (one draft forward each)"
        if key in seen:
            return f"path {list(key)} is listed twice"
        seen.add(key)
    for key in seen:
        if len(key) > 1 and key[:-1] not in seen:
            return f"path {list(key)} has no parent: add {list(key[:-1])}"
    return None


@dataclass
class PromptLookupSettings:
    """Prompt lookup decoding (Saxena 2023)."""

    max_ngram_size: int = setting(3, at_least(1), "longest suffix n-gram searched for in the context")
    num_draft_tokens: int = setting(10, at_least(1), "draft length when a match is found")
    min_ngram_size: int = setting(1, at_least(1), "shortest suffix n-gram tried (<= max_ngram_size)")


def register_decoder(name: str, target: str, settings: type, *, uses_draft: bool = False) -> Registered:
    """Register decoder ``name``: its class's import path ``target``, its ``settings`` class, and whether it needs
    the pair's draft model; its Hydra schema ``base_decoder_<name>`` follows (:mod:`harness.config.schemas`).

    Raises:
        ValueError: ``name`` registered already with another class or settings.
    """
    return register("decoder", name, target, settings, uses_draft=uses_draft)


# The decoders there are: config name (schema base_decoder_<name>), class (imported when built), settings, draft.
register_decoder("vanilla", "decoders.vanilla.VanillaDecoder", VanillaSettings)
register_decoder("speculative", "decoders.speculative.SpeculativeDecoder", SpeculativeSettings, uses_draft=True)
register_decoder("hf_assisted", "decoders.hf_assisted.HFAssistedDecoder", HFAssistedSettings, uses_draft=True)
register_decoder("hf_greedy", "decoders.hf_assisted.HFGreedyDecoder", HFGreedySettings)
register_decoder("lookahead", "decoders.lookahead.LookaheadDecoder", LookaheadSettings)
register_decoder("ouroboros", "decoders.ouroboros.OuroborosDecoder", OuroborosSettings, uses_draft=True)
register_decoder("prompt_lookup", "decoders.prompt_lookup.PromptLookupDecoder", PromptLookupSettings)
register_decoder("opt_tree", "decoders.opt_tree.OptTreeDecoder", OptTreeSettings, uses_draft=True)
register_decoder("fixed_tree", "decoders.fixed_tree.FixedTreeDecoder", FixedTreeSettings, uses_draft=True)
