"""The runner's settings (``conf/runner/default.yaml``, schema :class:`harness.config.schemas.RunnerConfig`): the
generation budget, warm-up, seeds and sampling, resume, sample selection, repeats, the decoder order and
shards, checked on construction (:class:`RunSettings`), and the order rule (:func:`decoder_order`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from declare import check_args
from decoders.common.sampling import SamplingConfig
from harness.config.schemas import RunnerConfig
from tasks.types import Sample


#: How ``runner.order=rotate`` orders the decoders (recorded in ``meta.json``).
ROTATION_RULE = ("for sample_index i and repeat r, position p runs decoders[(i + r + p) % len(decoders)] "
                 "(decoders as listed, vanilla first)")


def parse_shard(spec: Any) -> tuple[int, int] | None:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``; ``None`` -> ``None``.

    Raises:
        ValueError: any other value; the message shows the expected form.
    """
    if spec is None:
        return None
    try:
        i, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise ValueError(f"runner.shard must be 'i/n' with 0 <= i < n (shard i of n, counted from 0), e.g. "
                         f"runner.shard=0/4, got {spec!r}")
    return i, n


def decoder_order(names: list[str], sample_index: int, repeat: int, order: str) -> list[str]:
    """The order the decoders run in on one (sample, repeat) (see :data:`ROTATION_RULE`).

    Example: ``decoder_order(["vanilla", "a", "b"], 1, 0, "rotate")`` is ``["a", "b", "vanilla"]``.
    """
    if order == "fixed":
        return list(names)
    k = (sample_index + repeat) % len(names)
    return list(names[k:]) + list(names[:k])


@dataclass
class RunSettings(RunnerConfig):
    """Runner settings (``conf/runner/default.yaml``): the declared fields of
    :class:`harness.config.schemas.RunnerConfig` (defaults, bounds, meanings: ``python run.py list``), checked on
    construction, plus ``extra``.

    Attributes:
        max_new_tokens: generation budget; ``None`` = the task's default. Must be >= 1.
        warmup: untimed warm-up calls per decoder, on the first prompt it can run (non-empty, fitting).
        warmup_tokens: ``max_new_tokens`` of each warm-up call.
        seed: torch seed set before the run; when sampling, also the run seed every cell's generator seed is
            derived from (:func:`decoders.common.sampling.sample_seed` of seed, sample id, turn, repeat: every
            decoder of one cell gets the same seed).
        temperature, top_p, top_k: the sampling settings of every decoder
            (:class:`decoders.common.sampling.SamplingConfig`); temperature 0 = greedy (the default).
        score: score quality (vanilla's output, plus any decoder whose output differs).
        resume: skip the cells already done in the folder's ``results.jsonl`` (same run identity only; a
            folder of another identity is refused) and adopt its ``run_id``; false = start the folder over
            (its files move to ``superseded/<time>/``). See :mod:`harness.job.resume`.
        sample_ids: run only these samples (their ``sample_id``, e.g. ``["HumanEval/1", "HumanEval/8"]``),
            in the task's order, out of those ``task.limit`` selects; ``None`` = all of them. Meant for
            re-running divergent samples in the float32 referee mode. Warm pools (``pool_scope=task``) then
            see only these samples, so warm-start speed is not comparable with a full run.
        repeats: timed calls per (sample, decoder) cell, >= 1 (``repeat`` column 0..repeats-1).
        order: ``rotate`` (decoder order rotated per sample and repeat) or ``fixed`` (as listed, vanilla
            first).
        shard: ``"i/n"``: run only the samples with ``sample_index % n == i`` (``None`` = all).
        batch_size: requests decoded together (:class:`harness.job.batches.BatchRunner` when > 1: static batches of
            this shard's samples, every decoder on the same batches).

    Raises:
        ValueError: a setting of the wrong type or out of its bound, bad sampling settings, a shard not of the
            form ``i/n``, or ``sample_ids`` that is not a non-empty list.
    """

    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_args(RunnerConfig, vars(self), prefix="runner.")
        try:
            self.sampling = SamplingConfig(self.temperature, self.top_p, self.top_k)
        except ValueError as e:
            raise ValueError(f"runner sampling settings: {e}") from None
        parse_shard(self.shard)
        if self.shard is not None:
            self.shard = "{}/{}".format(*parse_shard(self.shard))
        if self.sample_ids is not None:
            if isinstance(self.sample_ids, str) or not isinstance(self.sample_ids, (list, tuple)) \
                    or not self.sample_ids:
                raise ValueError("runner.sample_ids must be a non-empty list of sample ids, e.g. "
                                 f"'runner.sample_ids=[HumanEval/1,HumanEval/8]' (or null), got {self.sample_ids!r}")
            self.sample_ids = [str(i) for i in self.sample_ids]  # Hydra parses `[81]` as int

    def select(self, samples: list[Sample]) -> list[Sample]:
        """The samples to run: all, or those named in ``sample_ids`` (in the task's order).

        Raises:
            ValueError: an id in ``sample_ids`` is not among ``samples``; the message lists a few valid ids
                and says to raise ``task.limit`` when the id lies beyond it.
        """
        if self.sample_ids is None:
            return samples
        known = {s.sample_id for s in samples}
        missing = [i for i in self.sample_ids if i not in known]
        if missing:
            shown = ", ".join(s.sample_id for s in samples[:5]) + (", ..." if len(samples) > 5 else "")
            raise ValueError(f"runner.sample_ids {missing} are not among the task's {len(samples)} selected samples "
                             f"({shown}); check the spelling, or raise task.limit (null = all) if they lie beyond it")
        wanted = set(self.sample_ids)
        return [s for s in samples if s.sample_id in wanted]
