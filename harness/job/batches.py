"""The runner at ``runner.batch_size = B > 1``: static batches of requests sharing the machine.

This shard's samples are cut into consecutive batches of ``B`` (the last may be smaller); every decoder decodes the
same batches (``generate_batch``: one target forward per step for every row still decoding; docs/decoders.md,
"Static batches"). Per batch and repeat the decoders run in the rotated order of :func:`decoder_order` with the
batch's index in place of the sample's, vanilla among them (the paired reference at the same ``B``). One call is one
cell per decoder; it writes one row per request, all of them after the call:

* ``wall_time_s`` is the batch call's, so ``tokens_per_s`` (``new_tokens / wall_time_s``) and the paired
  ``speedup`` of a row are the batch's: every row of a batch has the ratio of the two batch calls' times, and the
  report's intervals resample batches, not rows (:mod:`harness.rows.cell_figures`);
* ``batch_tokens_per_s`` is the batch's throughput (its tokens / its wall seconds), ``batch_rows`` its size;
* ``ttft_s`` is the batched prefill's, ``latency_s`` the seconds until the request's own last token, ``tpot_s``
  ``(latency_s - ttft_s) / (new_tokens - 1)``: per-request serving latencies, as ``vllm bench serve`` reports them;
* ``batch_cost_curve``: the target's bare forward of ``B`` rows x ``k`` tokens (``k`` in :data:`COST_POINTS`), in
  multiples of one token at batch size 1, timed once per job after the warm-up: what speculation's wider forwards
  cost at this batch size.

Rules that keep batches comparable: a sample some decoder must skip (an empty prompt, or too long for a model's
context) is skipped for every decoder, so each decoder decodes exactly the same batches; a batch cell is done
(resume) only when each of its requests has a row, otherwise the whole batch runs again; the rows of one call
are written together (a Ctrl-C waits for all of them). Single-turn tasks only (:func:`harness.job.app.check_selection`
refuses a multi-turn task before models load).
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

import torch
from tqdm.auto import tqdm

from decoders.common.cost import batch_cost_curve, curve_text
from harness.job.cell import Cell, cell_row, load_1m, timed_generate_batch
from harness.job.run_settings import decoder_order
from harness.job.runner import Runner
from tasks.types import Sample

log = logging.getLogger(__name__)
#: Tokens per row at which the target's bare batched forward is timed before the first timed batch
#: (``batch_cost_curve`` in every row).
COST_POINTS = (1, 2, 4, 8)


class BatchRunner(Runner):
    """:class:`harness.job.runner.Runner` with the cells of static batches (this module's docstring); same arguments.
    ``settings.batch_size`` is ``B``."""

    def batches(self) -> list[list[tuple[int, Sample]]]:
        """This shard's ``(sample_index, sample)`` pairs in consecutive batches of ``runner.batch_size``."""
        size = self.settings.batch_size
        return [self.work[i: i + size] for i in range(0, len(self.work), size)]

    def _base_row(self, sample: Sample, index: int, name: str, turn: int, repeat: int, position: int,
                  prompt_tokens: int) -> dict[str, Any]:
        if not hasattr(self, "_batch_of"):
            self._batch_of = {i: b for b, members in enumerate(self.batches()) for i, _ in members}
        return {**super()._base_row(sample, index, name, turn, repeat, position, prompt_tokens),
                "batch_index": self._batch_of.get(index), "batch_cost_curve": getattr(self, "_cost_curve", None)}

    def _run_work(self) -> None:
        batches = self.batches()
        self._bar = tqdm(batches, desc=f"{self.task.name} batches of {self.settings.batch_size}"
                         + (f" shard {self.shard_spec}" if self.shard else ""), unit="batch")
        for b, members in enumerate(self._bar):
            self._run_batch(b, members)

    def _warm_all(self) -> None:
        """Warm every decoder with ``runner.warmup`` untimed batch calls on the first batch's runnable prompts, then
        measure the target's bare cost curve at this batch size (:data:`COST_POINTS`)."""
        members = self._runnable(self.batches()[0])[0] if self.work else []
        if not members:
            return
        ids = [self._encode(self._render(s, 0, [])) for _, s in members]
        self._cost_curve = self._measure_cost(ids[0])
        if not self.settings.warmup:
            return
        for name, decoder in self.decoders.items():
            try:
                for _ in range(self.settings.warmup):
                    gens = self._generators(members, 0) if not self.settings.sampling.greedy else None
                    timed_generate_batch(decoder, ids, self._warmup.tokens, self._draft(name), gens)
                if hasattr(decoder, "reset"):
                    decoder.reset()  # warm-up must not seed cross-sample state (n-gram pools)
            except Exception as e:  # noqa: BLE001 -- its first cell runs (and records) it again
                log.warning("warm-up of %s failed (%s: %s); its first cell will say why", name, type(e).__name__, e)

    def _measure_cost(self, context: torch.Tensor) -> str:
        """``"k:ratio,..."``: seconds of the target's forward of ``k`` tokens in each of ``B`` rows after ``context``
        (:func:`decoders.common.cost.batch_cost_curve`), as multiples of one token at batch size 1."""
        one = batch_cost_curve(self.pair.target, 1, [1], context=context)[1]
        curve = batch_cost_curve(self.pair.target, self.settings.batch_size, list(COST_POINTS), context=context)
        return curve_text(curve, one)

    def _generators(self, members: list[tuple[int, Sample]], repeat: int) -> list[torch.Generator]:
        return [self._generate_kwargs(s.sample_id, 0, repeat)[0]["generator"] for _, s in members]

    def _runnable(self, members: list[tuple[int, Sample]]) -> tuple[list[tuple[int, Sample]], dict[int, tuple]]:
        """The batch's samples every decoder can run, and for the others ``(status, reason)`` by sample index (the
        first decoder's reason: the sample is skipped for all, so batches stay identical)."""
        keep, skipped = [], {}
        for index, sample in members:
            text = self._render(sample, 0, [])
            tokens = int(self._encode(text).shape[1]) if text else 0
            reasons = [(n, r) for n in self.decoders if (r := self._skip(n, text, tokens)) is not None]
            if reasons:
                name, (status, reason) = reasons[0]
                skipped[index] = (status, f"{reason} (for {name}; skipped for every decoder so that every decoder "
                                          "decodes the same batches)")
            else:
                keep.append((index, sample))
        return keep, skipped

    def _run_batch(self, b: int, members: list[tuple[int, Sample]]) -> None:
        """Every decoder's cell of batch ``b`` (each repeat); a decoder's rows are written after its call, held
        until vanilla's tokens on the batch exist when it ran before vanilla."""
        runnable, skipped = self._runnable(members)
        ids = {index: self._encode(self._render(sample, 0, [])) for index, sample in runnable}  # outside timers
        scores: dict[int, dict[str, dict[str, Any]]] = {index: {} for index, _ in members}
        for repeat in range(self.settings.repeats):
            order = decoder_order(list(self.decoders), b, repeat, self.settings.order)
            refs: dict[int, tuple[tuple[int, ...], bool]] = {}  # sample index -> vanilla's tokens, other process
            if self.resume_state is not None and all(self._done(s, "vanilla", 0, repeat) for _, s in members):
                for index, sample in runnable:
                    stored = self.resume_state.vanilla.get((sample.sample_id, 0))
                    if stored is not None:
                        refs[index] = (tuple(stored[0]), stored[1] != self.attempt_id)
            vanilla_ran = bool(refs)
            held: list[tuple[Sample, Cell]] = []
            for position, name in enumerate(order):
                if all(self._done(s, name, 0, repeat) for _, s in members):
                    self.skipped_cells += len(members)
                    continue
                self._bar.set_postfix_str(name + (f" (repeat {repeat})" if self.settings.repeats > 1 else ""))
                rows = [{**self._base_row(s, i, name, 0, repeat, position, 0), "status": skipped[i][0],
                         "reason": skipped[i][1]} for i, s in members if i in skipped]
                if runnable:
                    cells, failed = self._call(name, b, repeat, position, runnable, ids)
                    rows += failed
                    held += [(sample, cell) for (_, sample), cell in zip(runnable, cells)]
                    if name == "vanilla":
                        vanilla_ran = True
                        refs = {index: (tuple(c.result.token_ids), False) for (index, _), c in zip(runnable, cells)}
                if vanilla_ran:
                    rows += [self._row_of(s, c, refs, scores) for s, c in held]
                    held = []
                self._write_all(rows)
            # vanilla gave no output on this batch: nothing to compare with
            self._write_all([self._row_of(s, c, {}, scores) for s, c in held])

    def _call(self, name: str, b: int, repeat: int, position: int, runnable: list[tuple[int, Sample]],
              ids: dict[int, torch.Tensor]) -> tuple[list[Cell], list[dict[str, Any]]]:
        """One decoder's timed call on a batch: ``(cells, [])``, or ``([], error rows)`` when it raised."""
        decoder = self.decoders[name]
        rows = [self._base_row(s, i, name, 0, repeat, position, int(ids[i].shape[1])) for i, s in runnable]
        try:
            gens = None
            if not self.settings.sampling.greedy:
                gens = self._generators(runnable, repeat)
                for row, (_, s) in zip(rows, runnable):
                    row["sample_seed"] = self._generate_kwargs(s.sample_id, 0, repeat)[1]
            before = load_1m()
            results, wall, measured = timed_generate_batch(decoder, [ids[i] for i, _ in runnable],
                                                           self.max_new_tokens, self._draft(name), gens)
            after = load_1m()
        except Exception as e:
            self.errors += 1
            log.error("%s on batch %d failed:\n%s", name, b, traceback.format_exc())
            return [], [{**row, "status": "error", "reason": f"{type(e).__name__}: {e}"} for row in rows]
        cells = []
        for row, result, cols in zip(rows, results, measured):
            completion = self.pair.tokenizer.decode(list(result.token_ids), skip_special_tokens=True,
                                                    clean_up_tokenization_spaces=False)
            cells.append(Cell(row, result, wall, completion, {"load_1m_before": before, "load_1m_after": after,
                                                              **cols}))
        return cells, []

    def _row_of(self, sample: Sample, cell: Cell, refs: dict[int, tuple[tuple[int, ...], bool]],
                scores: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
        """The ``ok`` row of a cell, compared with vanilla's tokens on its sample (``refs``) when they exist."""
        index = cell.row["sample_index"]
        ref, other_process = refs.get(index, (None, False))
        row = cell_row(cell, ref, self.settings.sampling.greedy,
                       cross_process=other_process and cell.row["decoder"] != "vanilla",
                       scores=self._score(sample, cell.completion, scores[index]))
        if row["matches_vanilla"] is False:
            log.warning("%s differs from vanilla on %s (repeat %d, batch %s) at token %s", row["decoder"],
                        sample.sample_id, row["repeat"], row["batch_index"], row["first_divergence"])
        return row

    def _write_all(self, rows: list[dict[str, Any]]) -> None:
        """Append rows together: a SIGINT meanwhile takes effect once all of them are written."""
        if rows:
            with self._interrupts.writing():
                for row in rows:
                    self.writer.write(row)
