"""The benchmark runner: same token ids to every decoder, warm-up excluded, synchronized timers, decoders
interleaved per sample in a rotating order, each (sample, decoder) cell measured ``repeats`` times, one
result row appended per cell as soon as it is computed (or, for a cell that ran before vanilla on its
sample, as soon as vanilla's output -- the equality reference -- exists).

The measurement design (order, repeats, warm-up, skips, conversations, shards, resume, Ctrl-C) is described in
docs/measurement.md, "How cells are measured". Where the code is: the order in
:func:`harness.job.run_settings.decoder_order` (rows record ``order_position``); the warm-up in
:mod:`harness.job.warmup`; multi-turn conversations (turns after one without an answer are ``skipped``) in
:mod:`harness.job.conversation`; Ctrl-C (a row being written is finished first, then the summary of the finished
cells is written and :attr:`Runner.interrupted` is set) in :mod:`harness.job.interrupts`; the timed call and its
row in :mod:`harness.job.cell`. Each row records the 1-minute load average before and after its timed call, the
CPU count and the affinity count (the summary's load warning comes from :mod:`harness.rows.metrics`, like every
number of the summary). ``runner.shard=i/n`` runs the samples with ``sample_index % n == i`` (vanilla included,
so every pair stays within one process); rows carry ``shard`` and the shard-free ``run_identity``. A decoder row
without a vanilla answer to compare with (vanilla failed on that turn) has ``matches_vanilla=None`` and
``equality_check=None``: it makes no equality claim.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import traceback
import uuid
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from harness.rows.grouping import settings_label
from harness.config.identity import resolve_path
from harness.config.schemas import declared_defaults
from harness.report.summary import write_summary
from harness.rows.machine import cpu_affinity, emulated_half_note
from harness.rows.results import ResultWriter, read_results
from harness.job import resume as resume_lib
from harness.job.cell import Cell, cell_row, load_1m, timed_generate
from harness.job.conversation import Conversation, Reference
from harness.job.interrupts import StopAfterWrites
from harness.job.warmup import WARMUP_SEARCH, WarmUp
from harness.job.run_settings import ROTATION_RULE, RunSettings, decoder_order, parse_shard
from decoders.common.cost import batch_cost_curve, curve_text
from decoders.common.sampling import make_generator, sample_seed
from tasks.base import encode_prompt
from tasks.types import Sample

log = logging.getLogger(__name__)
#: Tokens at which each model's bare forward is timed once per job (:meth:`Runner._measure_bare`), and the seconds
#: of timed calls after which a point's timing stops (:func:`decoders.common.cost.batch_cost_curve`: up to 3 calls
#: per point, fewer where they are that long). ~10 s on the 1.5B / 0.5B pair in bfloat16 on a 2-core CPU with bf16
#: units, ~45 s in float32 on one without (~1.6 min when every point took 3 calls), milliseconds on tiny models.
BARE_POINTS = (1, 2, 4, 8, 16, 32, 64)
BARE_ENOUGH_S = 1.0


class Runner:
    """Runs every (sample, decoder, repeat) cell of one task and writes rows, then the summary.

    Constructing it checks the run folder against this run's identity (:func:`harness.job.resume.prepare_folder`:
    refuses a folder of another identity, or moves its files aside when ``resume`` is off) and only then
    writes ``meta.json``.

    Args:
        task: a :class:`tasks.base.Task`.
        pair: the loaded :class:`harness.job.models.ModelPair`.
        decoders: name -> decoder; ``vanilla`` must be among them.
        decoder_params: name -> hyper-parameters to record with each row.
        settings: :class:`RunSettings`.
        run_dir: output folder.
        identity: columns identifying the run (model names, dtype, device, ...), added to every row.
        chat: the model config's ``chat_template`` flag (with the task's prompt style and the tokenizer it
            decides whether prompts go through the chat template: :meth:`tasks.base.Task.uses_chat`).
        config: the resolved config (plain containers), part of the run identity and of ``meta.json``.
        environment: :func:`harness.rows.results.environment`, part of the run identity and of ``meta.json``.
        meta: more entries for ``meta.json`` (e.g. ``eos_token_ids``).
        draft_users: names of the decoders that run the draft model (their prompts must also fit the
            draft's context).

    Raises:
        harness.job.resume.ResumeMismatchError: the folder holds rows of another run identity.
    """

    def __init__(
        self,
        task: Any,
        pair: Any,
        decoders: Mapping[str, Any],
        decoder_params: Mapping[str, Mapping[str, Any]],
        settings: RunSettings,
        run_dir: str | Path,
        identity: Mapping[str, Any],
        chat: bool | None = None,
        config: Mapping[str, Any] | None = None,
        environment: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        draft_users: Collection[str] = (),
        notes: Sequence[str] = (),
    ):
        if "vanilla" not in decoders:
            raise ValueError("the vanilla decoder must be part of every run: it is the reference for speedup "
                             "and equality")
        self.task = task
        self.pair = pair
        self.decoders = {"vanilla": decoders["vanilla"], **{k: v for k, v in decoders.items() if k != "vanilla"}}
        self.decoder_params = decoder_params
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.identity = dict(identity)
        self.chat = task.uses_chat(pair.tokenizer, chat)  # decided once, passed to every task call
        self.draft_users = set(draft_users)
        self.setup_notes = list(notes)   # what the caller found before the run (e.g. settings tuned elsewhere)
        self.writer = ResultWriter(self.run_dir)
        self.max_new_tokens = settings.max_new_tokens or int(task.max_new_tokens)
        self.context_length = int(getattr(pair.target.config, "max_position_embeddings", 0) or 0)
        draft = getattr(pair, "draft", None)
        self.draft_context_length = int(getattr(getattr(draft, "config", None), "max_position_embeddings", 0) or 0)
        self.cpu_count = os.cpu_count()
        self.cpu_affinity = cpu_affinity()
        self.errors = 0
        self.interrupted = False
        self.skipped_cells = 0
        self._warmup = WarmUp(settings.warmup, min(settings.warmup_tokens, self.max_new_tokens),
                              lambda: self._generate_kwargs("warmup", 0, 0)[0])
        self._interrupts = StopAfterWrites()
        self._bar: Any = None  # the progress bar while running
        self._bare: dict[str, Any] = {}  # the bare cost curves (:meth:`_measure_bare`), in every row
        self.attempt_id = uuid.uuid4().hex[:8]  # one per process: tells apart the processes of a resumed run

        # samples: the selection (task.limit, runner.sample_ids), then this shard's share of it
        self.samples = settings.select(list(task.samples()))
        self.shard = parse_shard(settings.shard)
        self.shard_spec = settings.shard
        self.work = [(i, s) for i, s in enumerate(self.samples)
                     if self.shard is None or i % self.shard[1] == self.shard[0]]

        # run identity (config + data + code + packages + machine), checked against the folder before writing
        self.identity_doc = resume_lib.build_identity(config or {}, environment or {}, self._data_identity())
        self.run_identity = resume_lib.identity_hash(self.identity_doc)
        self.group_identity = resume_lib.group_identity(self.identity_doc)
        self.resume_state = resume_lib.prepare_folder(self.run_dir, self.identity_doc, self.run_identity,
                                                      self.shard_spec, settings.resume)
        adopted = self.resume_state.run_id if self.resume_state else None
        self.run_id = identity.get("run_id") or adopted or uuid.uuid4().hex[:12]
        self._write_meta(config, environment, meta)
        half_precision_note = emulated_half_note(dict(environment or {}))
        if half_precision_note:  # said before anything is measured; the summary's warnings say it again
            log.warning("%s", half_precision_note)

    # ------------------------------------------------------------------------------------ identity
    def _data_identity(self) -> dict[str, Any]:
        """sha256 over the selected samples (ids, prompts, references, metadata) and their rendered first-turn
        prompts -- so the data file, few-shot exemplars, prompt style and chat template are all covered --
        plus where the data came from (a local file as one absolute path, so two spellings of it are one run)."""
        h = hashlib.sha256()
        for s in self.samples:
            rendered = self._render(s, 0, [])
            h.update(json.dumps([s.sample_id, s.prompt, s.messages, s.reference, s.metadata, rendered],
                                sort_keys=True, default=str).encode())
        origin = self.task.origin
        if origin is not None:
            origin = resolve_path(str(origin)) if os.path.exists(str(origin)) else str(origin)
        return {"fingerprint": h.hexdigest()[:16], "origin": origin,
                "samples": len(self.samples)}

    def _write_meta(self, config: Mapping[str, Any] | None, environment: Mapping[str, Any] | None,
                    meta: Mapping[str, Any] | None) -> None:
        names = list(self.decoders)
        doc = {
            "run_identity": self.run_identity,
            "identity": self.identity_doc,
            "run_id": self.run_id,
            "shard": (None if self.shard is None else
                      {"index": self.shard[0], "count": self.shard[1], "rule": "sample_index % count == index"}),
            "order": {"scheme": self.settings.order, "decoders": names,
                      "rule": ROTATION_RULE if self.settings.order == "rotate" else "decoders as listed, every sample"},
            "repeats": self.settings.repeats,
            "quality_columns": list(self.task.quality_columns),
            "config": dict(config or {}),
            "notes": list(self.setup_notes),
            "environment": dict(environment or {}),
            **dict(meta or {}),
        }
        (self.run_dir / "meta.json").write_text(json.dumps(doc, indent=1, default=str))

    # ------------------------------------------------------------------------------------- resume
    def _done(self, sample: Sample, name: str, turn: int, repeat: int) -> bool:
        """Whether the (sample, turn, repeat, decoder) cell already has a done row in the folder."""
        return (self.resume_state is not None
                and resume_lib.cell_key(self._base_row(sample, 0, name, turn, repeat, 0, 0)) in self.resume_state.done)

    def _stored_completion(self, sample: Sample, name: str, turn: int, repeat: int) -> str | None:
        """The answer of a done cell from the folder, or ``None`` when its row is a skip (no answer)."""
        params = json.dumps(dict(self.decoder_params.get(name, {})), sort_keys=True)
        return self.resume_state.completions.get((sample.sample_id, turn, repeat, name, params))

    # ------------------------------------------------------------------------------------ helpers
    def _turns(self, sample: Sample) -> int:
        """Number of chat turns of a sample (:meth:`tasks.base.Task.turns`)."""
        return int(self.task.turns(sample))

    def _render(self, sample: Sample, turn: int, previous_answers: list[str]) -> str:
        """Prompt text of one turn; turn k > 0 carries the decoder's own earlier answers."""
        if self._turns(sample) > 1:
            return self.task.render_turn(sample, self.pair.tokenizer, self.chat, turn, previous_answers)
        return self.task.render(sample, self.pair.tokenizer, self.chat)

    def _encode(self, text: str) -> torch.Tensor:
        """(1, prompt_len) int64 ids of a rendered prompt: the tokenizer's special-token convention for
        completion prompts, none added to chat-template text (:func:`tasks.base.encode_prompt`)."""
        tokenizer = self.pair.tokenizer
        ids = encode_prompt(tokenizer, text, chat=self.chat)
        return torch.tensor([ids], dtype=torch.long, device=self.pair.device)

    # ---------------------------------------------- sampling (runner.temperature / top_p / top_k / seed)
    def _sampling_columns(self) -> dict[str, Any]:
        """Columns of every row that describe the sampling setting (part of the configuration).
        ``sampling_seed`` is the run seed when sampling and ``None`` when greedy (no randomness)."""
        sampling = self.settings.sampling
        return {**sampling.columns(), "sampling_seed": None if sampling.greedy else self.settings.seed}

    def _generate_kwargs(self, sample_id: Any, turn: int, repeat: int) -> tuple[dict[str, Any], int | None]:
        """``generate`` keyword arguments of one cell and its seed: a fresh generator seeded by
        :func:`~decoders.common.sampling.sample_seed` (the same for every decoder of the cell), or nothing
        when greedy."""
        if self.settings.sampling.greedy:
            return {}, None
        seed = sample_seed(self.settings.seed, sample_id, turn, repeat)
        return {"generator": make_generator(seed, self.pair.device)}, seed

    def _skip(self, name: str, text: str, prompt_tokens: int) -> tuple[str, str] | None:
        """``(status, reason)`` when a cell cannot run: empty prompt (no text, or 0 tokens -- a tokenizer that
        adds BOS would turn an empty text into BOS alone), or too long for a model's context."""
        if not text or prompt_tokens == 0:
            return "empty_prompt", (f"the rendered prompt is empty ({len(text)} characters, {prompt_tokens} tokens): "
                                    "there is nothing to condition on (check the task's data for an empty prompt)")
        total = prompt_tokens + self.max_new_tokens
        for role, ctx, model in (("target", self.context_length, self.pair.target_name),
                                 ("draft", self.draft_context_length if name in self.draft_users else 0,
                                  getattr(self.pair, "draft_name", None))):
            if ctx and total > ctx:
                return "prompt_too_long", (f"prompt ({prompt_tokens} tokens) + max_new_tokens ({self.max_new_tokens}) "
                                           f"exceeds the {role} model's ({model}) context of {ctx} tokens")
        return None

    def _draft(self, name: str) -> torch.nn.Module | None:
        """The draft model when decoder ``name`` runs it (its prefill is timed, its context limits prompts)."""
        return self.pair.draft if name in self.draft_users else None

    def _warm_all(self) -> None:
        """Warm every decoder of the job before its first timed cell (:meth:`harness.job.warmup.WarmUp.every`),
        each on the first turn-0 prompt of the first :data:`WARMUP_SEARCH` samples it can run; nothing when
        every cell left is done (resume)."""
        pending = [n for n in self.decoders if n not in self._warmup.warmed]
        if not self.settings.warmup or not pending:
            return
        if all(self._done(s, n, 0, r) for _, s in self.work for n in pending for r in range(self.settings.repeats)):
            return  # resume: nothing left to time
        texts = (self._render(sample, 0, []) for _, sample in self.work[:WARMUP_SEARCH])
        self._warmup.every(self.decoders, ((text, self._encode(text) if text else None) for text in texts),
                           lambda name, text, ids: self._skip(name, text, int(ids.shape[1])) is None, self._draft)

    def _measure_bare(self) -> None:
        """Time the bare forward of each model in use over ``k`` tokens (:data:`BARE_POINTS`) after the job's first
        prompt, once per job after the warm-up, before the first timed cell: the rows' ``bare_token_s`` (the
        target's one-token forward, seconds) and ``target_cost_curve`` / ``draft_cost_curve`` (``"k:ratio,..."``
        in units of it), against which the report sets each decoder's in-situ verify and draft costs. Nothing
        without a warm-up (smoke runs), at a batch size above 1 (one row's curve is not a batch's), when every cell
        is done (resume), or without a prompt; a failure is logged and leaves the columns empty (no cell depends on
        them)."""
        if self._bare or not self.settings.warmup or not self.work or self.settings.batch_size > 1:
            return  # a batch's forwards are set against the batched curve (batch_cost_curve) instead
        if all(self._done(s, n, 0, r) for _, s in self.work for n in self.decoders
               for r in range(self.settings.repeats)):
            return
        text = self._render(self.work[0][1], 0, [])
        if not text:
            return
        context = self._encode(text)
        try:
            target = batch_cost_curve(self.pair.target, 1, list(BARE_POINTS), context=context,
                                      enough_s=BARE_ENOUGH_S)
            unit = target[1]
            self._bare = {"bare_token_s": unit, "target_cost_curve": curve_text(target, unit)}
            draft = getattr(self.pair, "draft", None)
            if self.draft_users and draft is not None:
                curve = batch_cost_curve(draft, 1, list(BARE_POINTS), context=context, enough_s=BARE_ENOUGH_S)
                self._bare["draft_cost_curve"] = curve_text(curve, unit)
        except Exception as e:  # noqa: BLE001 -- the curves are context for the report, not a cell's measurement
            log.warning("the bare cost curves could not be timed (%s: %s); the rows leave them empty",
                        type(e).__name__, e)

    def _base_row(self, sample: Sample, index: int, name: str, turn: int, repeat: int, position: int,
                  prompt_tokens: int) -> dict[str, Any]:
        params = dict(self.decoder_params.get(name, {}))
        return {
            "run_id": self.run_id,
            "attempt_id": self.attempt_id,
            "run_identity": self.run_identity,
            "group_identity": self.group_identity,
            "shard": self.shard_spec,
            **self.identity,
            "task": self.task.name,
            "task_version": self.task.version,
            "quality_columns": list(self.task.quality_columns),
            "sample_id": sample.sample_id,
            "sample_index": index,
            "turn": turn,
            "repeat": repeat,
            "order_position": position,
            **{k: sample.metadata[k] for k in ("category", "subtask") if k in sample.metadata},
            "decoder": name,
            "decoder_class": type(self.decoders[name]).__name__,
            "draft_shape": self.decoders[name].draft_shape,
            **params,
            "decoder_params": json.dumps(params, sort_keys=True),
            "max_new_tokens": self.max_new_tokens,
            **self._sampling_columns(),
            "prompt_tokens": prompt_tokens,
            "batch_size": self.settings.batch_size,
            "cpu_count": self.cpu_count,
            "cpu_affinity": self.cpu_affinity,
            **self._bare,
        }

    def _score(self, sample: Sample, completion: str, cache: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Quality scores of a completion, computed once per distinct completion of a sample turn."""
        if not self.settings.score:
            return {}
        if completion not in cache:
            try:
                cache[completion] = self.task.score(sample, completion, self.chat)
            except Exception as e:  # scoring must never lose the speed row
                log.warning("scoring %s failed: %s", sample.sample_id, e)
                cache[completion] = {"score_error": str(e)}
        return cache[completion]

    def _write(self, row: dict[str, Any]) -> None:
        """Append one row; a SIGINT arriving meanwhile takes effect once the row is complete."""
        with self._interrupts.writing():
            self.writer.write(row)

    # ---------------------------------------------------------------------------------------- run
    def run(self) -> pd.DataFrame:
        """Run all cells; returns the summary (also written as ``summary.csv`` / ``summary.md``).

        Per sample and repeat, decoders run one after the other in the rotated order. Identical prompt texts
        are tokenized once, so every decoder gets the same ids; on turn k > 0 of a multi-turn task each
        decoder is asked with its own earlier answers (identical to vanilla's whenever its outputs were).
        On Ctrl-C the finished cells are summarised and :attr:`interrupted` is set.
        """
        torch.manual_seed(self.settings.seed)
        warm = [n for n, d in self.decoders.items() if getattr(d, "pool_scope", None) == "task"]
        if warm and (self.shard or self.settings.repeats > 1):
            log.warning("%s keep an n-gram pool across samples (pool_scope=task): with shards each pool sees only "
                        "its shard's samples, and with repeats it sees a sample again; warm-start speed then "
                        "differs from a single pass (outputs do not)", warm)
        try:
            with self._interrupts.installed():
                self._warm_all()
                self._measure_bare()
                self._run_work()
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            if self._bar is not None:
                self._bar.close()
        if self.skipped_cells:
            log.info("resume: skipped %d cells already done in %s", self.skipped_cells, self.writer.path)
            if warm:
                log.warning("resume: %s keep an n-gram pool across samples (pool_scope=task); after skipping "
                            "done samples their pools miss those samples, so warm-start speed differs from an "
                            "uninterrupted run (outputs do not)", warm)
        return self.write_summary()

    def _run_work(self) -> None:
        """Every cell of this shard's samples, one sample after the other (a progress bar over samples)."""
        self._bar = tqdm(self.work, desc=self.task.name + (f" shard {self.shard_spec}" if self.shard else ""),
                         unit="sample")
        for index, sample in self._bar:
            self._run_sample(index, sample)

    def _run_sample(self, index: int, sample: Sample) -> None:
        """Every repeat and turn of one sample."""
        n_turns = self._turns(sample)
        names = list(self.decoders)
        refs: dict[int, Reference] = {}  # turn -> vanilla's token ids, attempt
        if self.resume_state is not None:
            for t in range(n_turns):
                if (sample.sample_id, t) in self.resume_state.vanilla:
                    refs[t] = self.resume_state.vanilla[(sample.sample_id, t)]
        scores: dict[int, dict[str, dict[str, Any]]] = {t: {} for t in range(n_turns)}
        for repeat in range(self.settings.repeats):
            order = decoder_order(names, index, repeat, self.settings.order)
            done = {(n, t) for n in order for t in range(n_turns) if self._done(sample, n, t, repeat)}
            self.skipped_cells += len(done)
            if len(done) == len(order) * n_turns:
                continue
            conversation = Conversation(sample, index, repeat, order, done, refs, scores)
            for turn in range(n_turns):
                self._run_turn(conversation, turn)

    def _run_turn(self, conv: Conversation, turn: int) -> None:
        """Run every decoder on one turn of one sample (one repeat) and write its rows; records each decoder's
        answer (or that it has none) in ``conv``.

        A cell measured before vanilla's on a sample it has no reference yet: it is held and written when
        vanilla's output exists (or, if vanilla produced none, without equality). A decoder whose conversation
        is broken (:meth:`Conversation.broken_history`) gets a ``skipped`` row instead of running on another
        history than vanilla's.
        """
        sample, repeat, refs, scores = conv.sample, conv.repeat, conv.refs, conv.scores[turn]
        encoded: dict[str, torch.Tensor] = {}
        vanilla_prompt = self._render(sample, turn, conv.answers["vanilla"])
        pending: list[Cell] = []
        vanilla_attempt = (self.resume_state.vanilla_attempts.get((sample.sample_id, turn, repeat))
                           if self.resume_state is not None else None)
        for position, name in enumerate(conv.order):
            self._bar.set_postfix_str(name + (f" (repeat {repeat})" if self.settings.repeats > 1 else ""))
            text = vanilla_prompt if name == "vanilla" else self._render(sample, turn, conv.answers[name])
            if (name, turn) in conv.done:  # resume: the stored answer carries the conversation on
                stored = self._stored_completion(sample, name, turn, repeat)
                if stored is None:
                    conv.no_answer(name, f"turn {turn} has no answer (its row in the folder is a skip)")
                else:
                    conv.answer(name, stored)
                continue
            broken = conv.broken_history(name, turn)
            if broken is not None:
                row = self._base_row(sample, conv.index, name, turn, repeat, position, 0)
                row["prompt_tokens"] = None  # not rendered for a run: the history it would carry is not vanilla's
                self._write({**row, "status": "skipped", "reason": broken})
                log.warning("%s (turn %d, %s) skipped: %s", sample.sample_id, turn, name, broken)
                conv.no_answer(name, f"turn {turn} skipped")
                continue
            if text not in encoded:
                encoded[text] = self._encode(text)  # tokenized once per distinct prompt, outside timers
            input_ids = encoded[text]
            row = self._base_row(sample, conv.index, name, turn, repeat, position, int(input_ids.shape[1]))
            if turn > 0:
                row["prompt_matches_vanilla"] = text == vanilla_prompt
            skip = self._skip(name, text, row["prompt_tokens"])
            if skip is not None:
                self._write({**row, "status": skip[0], "reason": skip[1]})
                log.warning("%s (turn %d, %s) skipped: %s", sample.sample_id, turn, name, skip[1])
                conv.no_answer(name, f"turn {turn} {skip[0]}")
                continue
            decoder = self.decoders[name]
            try:
                self._warmup.decoder(name, decoder, input_ids, self._draft(name))
                before = load_1m()
                generate_kwargs, row["sample_seed"] = self._generate_kwargs(sample.sample_id, turn, repeat)
                result, wall, timing = timed_generate(decoder, input_ids, self.max_new_tokens, self._draft(name),
                                                      **generate_kwargs)
                after = load_1m()
            except Exception as e:
                self.errors += 1
                log.error("%s on %s failed:\n%s", name, sample.sample_id, traceback.format_exc())
                self._write({**row, "status": "error", "reason": f"{type(e).__name__}: {e}"})
                conv.no_answer(name, f"turn {turn} error ({type(e).__name__}: {str(e)[:120]})")
                continue
            completion = self.pair.tokenizer.decode(list(result.token_ids), skip_special_tokens=True,
                                                     clean_up_tokenization_spaces=False)
            conv.answer(name, completion)
            cell = Cell(row, result, wall, completion, {"load_1m_before": before, "load_1m_after": after, **timing})
            if name == "vanilla":
                refs.setdefault(turn, (tuple(result.token_ids), self.attempt_id))
                vanilla_attempt = self.attempt_id
                for c in [cell, *pending]:
                    self._write_cell(sample, c, refs.get(turn), vanilla_attempt, scores)
                pending = []
            elif turn in refs:
                self._write_cell(sample, cell, refs[turn], vanilla_attempt, scores)
            else:
                pending.append(cell)
        for c in pending:  # vanilla gave no output on this turn: nothing to compare with
            self._write_cell(sample, c, None, None, scores)

    def _write_cell(self, sample: Sample, cell: Cell, ref: Reference | None,
                    vanilla_attempt: str | None, scores: dict[str, dict[str, Any]]) -> None:
        row = cell_row(cell, ref[0] if ref is not None else None, self.settings.sampling.greedy,
                       cross_process=(cell.row["decoder"] != "vanilla" and vanilla_attempt is not None
                                      and vanilla_attempt != self.attempt_id),
                       scores=self._score(sample, cell.completion, scores))
        if row["matches_vanilla"] is False:
            log.warning("%s differs from vanilla on %s (turn %d, repeat %d) at token %s", row["decoder"],
                        sample.sample_id, row["turn"], row["repeat"], row["first_divergence"])
        self._write(row)

    # ------------------------------------------------------------------------------------ summary
    def rows(self) -> pd.DataFrame:
        """This run's rows in the folder, one per cell (the latest ``ok`` one; see
        :func:`harness.job.resume.latest_rows`)."""
        if not self.writer.path.exists():
            return pd.DataFrame()
        rows = read_results([self.writer.path])
        if rows.empty or "run_identity" not in rows:
            return pd.DataFrame()
        return resume_lib.latest_rows(rows[rows["run_identity"] == self.run_identity].reset_index(drop=True))

    def notes(self) -> list[str]:
        """What only the runner knows for the summary: the caller's set-up notes (``notes``: e.g. decoders tuned
        on another dtype or machine) and that the run was interrupted. Every other warning (machine load,
        cross-process pairs, disagreeing estimators, half precision emulated by the CPU) comes from
        :mod:`harness.rows.metrics`, the same code that serves the report and the gate."""
        if not self.interrupted:
            return list(self.setup_notes)
        return [*self.setup_notes, "interrupted (Ctrl-C): this summary covers only the cells finished before it; "
                f"rerun the same command with hydra.run.dir={self.run_dir} to resume"]

    def write_summary(self) -> pd.DataFrame:
        """Write ``summary.csv`` and ``summary.md`` of this run's rows (:func:`harness.report.summary.write_summary`)
        with the run's header, the notes and the coverage of a shard; returns the summary."""
        rows = self.rows()
        self.measured = int((rows["status"] == "ok").sum()) if not rows.empty else 0
        self.status_counts = dict(rows["status"].value_counts()) if not rows.empty else {}
        sampling = self.settings.sampling
        sampled = ("" if sampling.greedy else f" temperature={sampling.temperature:g} top_p={sampling.top_p:g} "
                   f"top_k={sampling.top_k} seed={self.settings.seed}")
        shard = f" shard={self.shard_spec} ({len(self.work)} of {len(self.samples)} samples)" if self.shard else ""
        header = (f"task={self.task.name} target={self.pair.target_name} draft={self.pair.draft_name} "
                  f"dtype={self.identity.get('dtype')} device={self.identity.get('device_name')} "
                  f"max_new_tokens={self.max_new_tokens} repeats={self.settings.repeats} order={self.settings.order}"
                  f"{shard}{sampled} run_identity={self.run_identity}")
        settings = "; ".join(f"{name}: {label}" for name, p in self.decoder_params.items()
                             if (label := settings_label(dict(p), declared_defaults(self.decoders.get(name)),
                                                         hidden=())))
        if settings:  # every setting off its declared default, so a sweep's job names its point (`gamma=4`)
            header += f"\n\nSettings: {settings}."
        return write_summary(self.run_dir, rows, self.task.quality_columns, header, self.notes(), self.coverage())

    def coverage(self) -> str:
        """What a shard's summary covers: its share of the selected samples, by rule and by id (empty for an
        unsharded run, which covers every selected sample)."""
        if self.shard is None:
            return ""
        i, n = self.shard
        ids = [s.sample_id for _, s in self.work]
        shown = ", ".join(map(str, ids[:8])) + (f", ... ({len(ids) - 8} more)" if len(ids) > 8 else "")
        return (f"Coverage: this folder is shard {i}/{n} of the run: {len(ids)} of the {len(self.samples)} selected "
                f"samples (sample_index % {n} == {i}: {shown or 'none'}). Every figure below is over these samples "
                f"only; the other {n - 1} shard(s) are in their own folders, and `python -m harness.report "
                "<shard folders>` merges them.")
