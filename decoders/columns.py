"""The statistics each decoder adds to its result rows (:meth:`decoders.common.driver.Proposer.extra`, merged
into :meth:`decoders.types.DecodeResult.summary`), declared next to the decoders and torch-free, so that the
rows schema (:mod:`harness.rows.columns`) gathers them without importing a decoder.

A decoder's hyper-parameters are columns of its rows too; they are declared by its settings
(:mod:`decoders.settings`), not here. A new statistic is one :class:`Statistic` in its decoder's tuple below
and the key its ``extra()`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Statistic:
    """One column a decoder adds to its rows.

    Attributes:
        name: the column name (a key of the decoder's ``extra()``).
        type: ``int``, ``float`` or ``str``.
        bound: ``count`` (>= 0), ``share`` (in [0, 1]) or ``""`` (unbounded; a string).
        meaning: one sentence, naming the decoder, with the unit where there is one.
        when: settings of the decoder (attributes of the built decoder) any of which, when true, makes it
            produce the column; empty: always produced.
    """

    name: str
    type: str
    bound: str
    meaning: str
    when: tuple[str, ...] = ()


_POOL_ENTRIES = Statistic("pool_entries", "int", "count", "lookahead, Ouroboros: n-grams in the pool at the end of "
                          "the sample")
_TREE_DEPTH = Statistic("tree_depth_per_step", "float", "count", "OPT-Tree, fixed trees: mean depth of the verified "
                        "tree")
_TREE_NODES = Statistic("tree_nodes_per_step", "float", "count", "OPT-Tree, fixed trees: mean nodes of the verified "
                        "tree")

_WINDOW_CUT = Statistic("draft_window_cut", "int", "count", "speculative, Ouroboros, OPT-Tree, fixed trees: prompt "
                        "tokens the draft did not read (its draft_window; 0: it read the whole prompt)")

#: Decoder class name -> the statistics its rows carry (a column shared by two decoders is declared once and
#: listed under both).
DECODER_STATISTICS: dict[str, tuple[Statistic, ...]] = {
    "LookaheadDecoder": (
        Statistic("pool_hit_rate", "float", "share", "lookahead: share of steps whose guesses came from the n-gram "
                  "pool"),
        Statistic("guess_tokens_fed", "int", "count", "lookahead: n-gram guess tokens fed for verification"),
        _POOL_ENTRIES,
    ),
    "PromptLookupDecoder": (
        Statistic("lookup_hit_rate", "float", "share", "prompt lookup: share of steps that found a match in the "
                  "context"),
    ),
    "SpeculativeDecoder": (_WINDOW_CUT,),
    "OptTreeDecoder": (
        _TREE_DEPTH,
        _TREE_NODES,
        _WINDOW_CUT,
        Statistic("cost_points", "str", "", "OPT-Tree cost-aware: the measured forward costs, k:target_ms/draft_ms",
                  when=("cost_aware",)),
        Statistic("copy_step_rate", "float", "share", "OPT-Tree hybrid: share of steps that used a context copy",
                  when=("copy_tokens",)),
        Statistic("copy_draft_rate", "float", "share", "OPT-Tree hybrid: share of the steps with a copy that also "
                  "grew the draft's tree (draft_on_copy; cost-aware: where the costs expected it to pay)",
                  when=("copy_tokens",)),
        Statistic("guess_fed_per_step", "float", "count", "OPT-Tree guessed chains: guessed tokens fed to the draft "
                  "per step", when=("guess_tokens",)),
        Statistic("guess_kept_per_step", "float", "count", "OPT-Tree guessed chains: guessed tokens the draft "
                  "ranked among its top num_nodes (tree levels grown without a forward of their own) per step",
                  when=("guess_tokens",)),
        Statistic("guess_verified_per_step", "float", "count", "OPT-Tree guessed chains: guessed nodes in the "
                  "verified tree per step", when=("guess_tokens",)),
    ),
    "FixedTreeDecoder": (
        Statistic("tree_levels", "str", "", "fixed trees: the shape's nodes per depth, e.g. 4+8+8+3+2"),
        _TREE_DEPTH,
        _TREE_NODES,
        _WINDOW_CUT,
    ),
    "OuroborosDecoder": (
        Statistic("draft_forwards_per_target_forward", "float", "count", "Ouroboros: draft forwards per decode "
                  "step"),
        Statistic("draft_tokens_per_draft_forward", "float", "count", "Ouroboros: draft tokens per lookahead "
                  "forward"),
        Statistic("draft_tokens_fed_per_forward", "float", "count", "Ouroboros: tokens fed per draft lookahead "
                  "forward"),
        Statistic("target_tokens_fed_per_forward", "float", "count", "Ouroboros: tokens fed per target forward"),
        Statistic("draft_pool_hit_rate", "float", "share", "Ouroboros: share of draft forwards whose guesses hit "
                  "the pool"),
        Statistic("suffix_offer_rate", "float", "share", "Ouroboros: share of steps that offered a pool suffix"),
        Statistic("suffix_hit_rate", "float", "share", "Ouroboros: share of offered suffixes with an accepted token"),
        Statistic("suffix_tokens_fed", "int", "count", "Ouroboros: suffix tokens fed for verification"),
        Statistic("suffix_tokens_accepted", "int", "count", "Ouroboros: suffix tokens accepted"),
        _POOL_ENTRIES,
        _WINDOW_CUT,
        Statistic("free_steps", "int", "count", "Ouroboros free drafts: steps drafted by copying, no draft forward",
                  when=("free_draft_min_match",)),
        Statistic("free_tokens_drafted", "int", "count", "Ouroboros free drafts: tokens copied",
                  when=("free_draft_min_match",)),
        Statistic("free_tokens_accepted", "int", "count", "Ouroboros free drafts: copied tokens accepted",
                  when=("free_draft_min_match",)),
        Statistic("branch_tokens_fed", "int", "count", "Ouroboros branches: runner-up tokens fed",
                  when=("stop_confidence", "branch_confidence")),
        Statistic("branch_tokens_accepted", "int", "count", "Ouroboros branches: runner-up tokens accepted",
                  when=("stop_confidence", "branch_confidence")),
    ),
}


def statistics() -> tuple[Statistic, ...]:
    """Every declared statistic once (first declaration wins), in declaration order."""
    return tuple({s.name: s for stats in DECODER_STATISTICS.values() for s in stats}.values())
