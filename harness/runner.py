"""The benchmark runner: same token ids to every decoder, warm-up excluded, synchronized timers,
decoders interleaved per sample with vanilla always first as the reference, one result row appended per
(sample, decoder) as soon as it is computed.
"""

from __future__ import annotations

import json
import logging
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import pandas as pd
import torch
from tqdm.auto import tqdm

from harness.metrics import summarize, to_markdown
from harness.results import ResultWriter, read_results
from harness.timing import Stopwatch
from harness import resume as resume_lib  # resume support (runner.resume)
from decoders.types import DecodeResult
from tasks.types import Sample

log = logging.getLogger(__name__)

#: Config keys of a decoder that are not hyper-parameters.
NON_PARAM_KEYS = {"_target_", "_partial_", "uses_draft"}


def first_divergence(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int | None:
    """Index of the first differing token of two whole sequences (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def timed_generate(decoder: Any, input_ids: torch.Tensor, max_new_tokens: int) -> tuple[DecodeResult, float, dict]:
    """Run ``decoder.generate`` with the runner's stopwatch (device synchronized at each mark); return the result,
    wall seconds and the stopwatch's columns (``ttft_s``, ``decode_tokens_per_s``, phase times)."""
    watch = Stopwatch(input_ids.device)
    watch.start()
    result = decoder.generate(input_ids, max_new_tokens, stopwatch=watch)
    wall = watch.stop()
    return result, wall, watch.columns(result.new_tokens)


@dataclass
class RunSettings:
    """Runner settings (``conf/runner/default.yaml``).

    Attributes:
        max_new_tokens: generation budget; ``None`` = the task's default. Must be >= 1.
        warmup: untimed warm-up calls per decoder before the first sample.
        warmup_tokens: ``max_new_tokens`` of each warm-up call.
        seed: torch seed set before the run.
        score: score quality (vanilla's output, plus any decoder whose output differs).
        resume: skip the (sample, decoder) cells of this configuration already done in the folder's
            ``results.jsonl`` and adopt its ``run_id`` (see :mod:`harness.resume`); false = recompute all
            under a new ``run_id``.
        sample_ids: run only these samples (their ``sample_id``, e.g. ``["HumanEval/1", "HumanEval/8"]``),
            in the task's order, out of those ``task.limit`` selects; ``None`` = all of them. Meant for
            re-running divergent samples in the float32 referee mode. Warm pools (``pool_scope=task``) then
            see only these samples, so warm-start speed is not comparable with a full run.
    """

    max_new_tokens: int | None = None
    warmup: int = 1
    warmup_tokens: int = 16
    seed: int = 0
    score: bool = True
    resume: bool = True
    sample_ids: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1):
            raise ValueError(f"runner.max_new_tokens must be an integer >= 1 (or null for the task default), "
                             f"got {self.max_new_tokens!r}")
        if self.warmup < 0:
            raise ValueError(f"runner.warmup must be >= 0, got {self.warmup}")
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


class Runner:
    """Runs every (sample, decoder) cell of one task and writes rows, then the summary.

    Args:
        task: a :class:`tasks.types.Task`.
        pair: the loaded :class:`harness.models.ModelPair`.
        decoders: name -> decoder, in the order to run; ``vanilla`` must be among them (it runs first).
        decoder_params: name -> hyper-parameters to record with each row.
        settings: :class:`RunSettings`.
        run_dir: output folder.
        identity: columns identifying the run (model names, dtype, device, ...), added to every row.
        chat: the model config's ``chat_template`` flag (passed to ``task.render``).
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
        self.chat = chat
        self.writer = ResultWriter(self.run_dir)
        self.max_new_tokens = settings.max_new_tokens or int(task.max_new_tokens)
        self.context_length = int(getattr(pair.target.config, "max_position_embeddings", 0) or 0)
        self.errors = 0
        self._warmed = False
        # --- resume support (runner.resume; harness/resume.py) ----------------------------------------
        self.attempt_id = uuid.uuid4().hex[:8]  # one per process: tells apart the processes of a resumed run
        self.resume_state: resume_lib.ResumeState | None = None
        if settings.resume and self.writer.path.exists():
            if resume_lib.repair_trailing_newline(self.writer.path):
                log.warning("%s ended in a partial row (killed mid-write); it is ignored", self.writer.path)
            self.resume_state = resume_lib.load_state(read_results([self.writer.path]), self._config())
            log.info("resume: %d cells of this configuration already done in %s (runner.resume=false "
                     "recomputes them)", len(self.resume_state.done), self.writer.path)
        adopted = self.resume_state.run_id if self.resume_state else None
        # --- end resume support -----------------------------------------------------------------------
        self.run_id = identity.get("run_id") or adopted or uuid.uuid4().hex[:12]

    # --- resume support (runner.resume) -----------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        """The configuration columns of this run's rows (:data:`harness.resume.CONFIG_FIELDS`)."""
        return {**self.identity, "task": self.task.name, "task_version": getattr(self.task, "version", None),
                "max_new_tokens": self.max_new_tokens}

    def _done(self, sample: Sample, name: str, turn: int) -> bool:
        """Whether the (sample, turn, decoder) cell already has a done row in the folder."""
        return (self.resume_state is not None
                and resume_lib.cell_key(self._base_row(sample, name, turn, 0)) in self.resume_state.done)

    def _stored(self, sample: Sample, name: str, turn: int) -> tuple[tuple[int, ...] | None, str]:
        """A done cell's stored (token ids if vanilla, completion text)."""
        row = self._base_row(sample, name, turn, 0)
        key = tuple(resume_lib.norm(row.get(k)) for k in ("sample_id", "turn", "repeat"))
        ids = self.resume_state.vanilla_token_ids.get(key) if name == "vanilla" else None
        text = self.resume_state.completions.get(key + (name, row["decoder_params"]), "")
        return ids, text
    # --- end resume support -----------------------------------------------------------------------

    # ---------------------------------------------------------------------------------------------
    def _turns(self, sample: Sample) -> int:
        """Number of chat turns of a sample (multi-turn tasks define ``turns``; others have one)."""
        return int(self.task.turns(sample)) if hasattr(self.task, "turns") else 1

    def _render(self, sample: Sample, turn: int, previous_answers: list[str]) -> str:
        """Prompt text of one turn; turn k > 0 carries the decoder's own earlier answers."""
        if hasattr(self.task, "render_turn") and self._turns(sample) > 1:
            return self.task.render_turn(sample, self.pair.tokenizer, self.chat, turn, previous_answers)
        return self.task.render(sample, self.pair.tokenizer, self.chat)

    def _encode(self, text: str) -> torch.Tensor:
        ids = self.pair.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        return ids.to(self.pair.device)

    def _warmup(self, input_ids: torch.Tensor) -> None:
        if self.settings.warmup <= 0:
            return
        for name, decoder in self.decoders.items():
            for _ in range(self.settings.warmup):
                decoder.generate(input_ids, min(self.settings.warmup_tokens, self.max_new_tokens))
            if hasattr(decoder, "reset"):
                decoder.reset()  # warm-up must not seed cross-sample state (n-gram pools)
            log.debug("warmed up %s", name)

    def _base_row(self, sample: Sample, name: str, turn: int, prompt_tokens: int) -> dict[str, Any]:
        params = dict(self.decoder_params.get(name, {}))
        return {
            "run_id": self.run_id,
            "attempt_id": self.attempt_id,
            **self.identity,
            "task": self.task.name,
            "task_version": getattr(self.task, "version", None),
            "sample_id": sample.sample_id,
            "turn": turn,
            "repeat": 0,
            **{k: sample.metadata[k] for k in ("category", "subtask") if k in sample.metadata},
            "decoder": name,
            **params,
            "decoder_params": json.dumps(params, sort_keys=True),
            "max_new_tokens": self.max_new_tokens,
            "prompt_tokens": prompt_tokens,
        }

    def _score(self, sample: Sample, completion: str) -> dict[str, Any]:
        if not self.settings.score:
            return {}
        try:
            return self.task.score(sample, completion)
        except Exception as e:  # scoring must never lose the speed row
            log.warning("scoring %s failed: %s", sample.sample_id, e)
            return {"score_error": str(e)}

    def run(self) -> pd.DataFrame:
        """Run all cells; returns the summary (also written as ``summary.csv`` / ``summary.md``).

        Per sample and turn, decoders run one after the other (vanilla first). Identical prompt texts are
        tokenized once, so every decoder gets the same ids; on turn k > 0 of a multi-turn task each decoder
        is asked with its own earlier answers (identical to vanilla's whenever its outputs were).
        """
        torch.manual_seed(self.settings.seed)
        samples = self.settings.select(list(self.task.samples()))
        skipped_cells = 0
        for sample in tqdm(samples, desc=f"{self.task.name}", unit="sample"):
            n_turns = self._turns(sample)
            # --- resume support: skip done cells; a sample with all cells done is not even encoded -----
            done = {(name, t) for name in self.decoders for t in range(n_turns) if self._done(sample, name, t)}
            skipped_cells += len(done)
            if len(done) == len(self.decoders) * n_turns:
                continue
            # --- end resume support -------------------------------------------------------------------
            answers: dict[str, list[str]] = {name: [] for name in self.decoders}
            for turn in range(n_turns):
                self._run_turn(sample, turn, done, answers)
        # --- resume support ------------------------------------------------------------------------
        if skipped_cells:
            log.info("resume: skipped %d cells already done in %s", skipped_cells, self.writer.path)
            warm = [n for n, d in self.decoders.items() if getattr(d, "pool_scope", None) == "task"]
            if warm:
                log.warning("resume: %s keep an n-gram pool across samples (pool_scope=task); after skipping "
                            "done samples their pools miss those samples, so warm-start speed differs from an "
                            "uninterrupted run (outputs do not)", warm)
        # --- end resume support ----------------------------------------------------------------------
        return self.write_summary()

    def _run_turn(self, sample: Sample, turn: int, done: set[tuple[str, int]], answers: dict[str, list[str]]) -> None:
        """Run every decoder on one turn of one sample and write its rows; appends to ``answers``."""
        encoded: dict[str, torch.Tensor] = {}
        reference: Any = None
        reference_scores: dict[str, Any] | None = {}
        vanilla_prompt: str | None = None
        for name, decoder in self.decoders.items():
            text = self._render(sample, turn, answers[name])
            if name == "vanilla":
                vanilla_prompt = text
            # --- resume support: a done cell supplies its stored answer (and vanilla's reference ids);
            # vanilla's scores are then recomputed when needed (reference_scores = None) ---------------
            if (name, turn) in done:
                ids, completion = self._stored(sample, name, turn)
                if name == "vanilla":
                    reference = SimpleNamespace(token_ids=ids) if ids is not None else None
                    reference_scores = None
                answers[name].append(completion)
                continue
            # --- end resume support ---------------------------------------------------------------------
            if text not in encoded:
                encoded[text] = self._encode(text)  # tokenized once per distinct prompt, outside timers
            input_ids = encoded[text]
            prompt_tokens = int(input_ids.shape[1])
            row = self._base_row(sample, name, turn, prompt_tokens)
            if turn > 0:
                row["prompt_matches_vanilla"] = text == vanilla_prompt
            if self.context_length and prompt_tokens + self.max_new_tokens > self.context_length:
                reason = (f"prompt ({prompt_tokens} tokens) + max_new_tokens ({self.max_new_tokens}) exceeds the "
                          f"target's context of {self.context_length} tokens")
                self.writer.write({**row, "status": "prompt_too_long", "reason": reason})
                log.warning("%s (turn %d, %s) skipped: %s", sample.sample_id, turn, name, reason)
                answers[name].append("")
                continue
            if not self._warmed:
                self._warmup(input_ids)
                self._warmed = True
            try:
                result, wall, timing = timed_generate(decoder, input_ids, self.max_new_tokens)
            except Exception as e:
                self.errors += 1
                log.error("%s on %s failed:\n%s", name, sample.sample_id, traceback.format_exc())
                self.writer.write({**row, "status": "error", "reason": f"{type(e).__name__}: {e}"})
                answers[name].append("")
                continue
            completion = self.pair.tokenizer.decode(list(result.token_ids), skip_special_tokens=True,
                                                     clean_up_tokenization_spaces=False)
            answers[name].append(completion)
            if name == "vanilla":
                reference = result
                matches, divergence = True, None
                scores = reference_scores = self._score(sample, completion)
            else:
                ref = reference.token_ids if reference is not None else None
                matches = ref is not None and result.token_ids == ref
                divergence = first_divergence(result.token_ids, ref) if ref is not None else None
                scores = (reference_scores if matches and reference_scores is not None
                          else self._score(sample, completion))
                if ref is not None and not matches:
                    log.warning("%s differs from vanilla on %s (turn %d) at token %s", name, sample.sample_id,
                                turn, divergence)
            self.writer.write({
                **row,
                **result.summary(),
                "wall_time_s": wall,
                "tokens_per_s": result.new_tokens / wall if wall > 0 else None,
                **timing,  # ttft_s, decode_tokens_per_s, <phase>_time_s (harness.timing.Stopwatch.columns)
                "matches_vanilla": matches,
                "first_divergence": divergence,
                **scores,
                "status": "ok",
                "completion": completion,
                "token_ids": list(result.token_ids),
            })

    def write_summary(self) -> pd.DataFrame:
        rows = read_results([self.writer.path])
        quality = [c for c in getattr(self.task, "quality_columns", ("pass@1",)) if c in rows.columns]
        # --- resume support: all rows of this configuration and decoder set in the folder, one per cell,
        # paired under this run_id whichever process wrote them (pairing by run folder + configuration) ----
        if self.settings.resume and not rows.empty:
            want = resume_lib.config_key(self._config())
            cells = {resume_lib.params_key(n, self.decoder_params.get(n, {})) for n in self.decoders}
            mine = [resume_lib.config_key(r) == want and (r.get("decoder"), r.get("decoder_params")) in cells
                    for r in rows.to_dict("records")]
            rows = resume_lib.latest_rows(rows[mine]).assign(run_id=self.run_id)
        # --- end resume support ----------------------------------------------------------------------
        summary = summarize(rows[rows["run_id"] == self.run_id] if "run_id" in rows else rows, quality)
        summary.to_csv(self.run_dir / "summary.csv", index=False)
        header = (f"task={self.task.name} target={self.pair.target_name} draft={self.pair.draft_name} "
                  f"dtype={self.identity.get('dtype')} device={self.identity.get('device_name')} "
                  f"max_new_tokens={self.max_new_tokens}\n"
                  "speedup = mean over samples of tokens/s(decoder) / tokens/s(vanilla), same process "
                  "(speedup_total = ratio of totals); accept_length = new tokens / target forwards "
                  "(prefill included)\n\n")
        (self.run_dir / "summary.md").write_text(header + to_markdown(summary) + "\n")
        return summary
