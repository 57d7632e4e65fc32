"""Exchange with Spec-Bench (hemingkx/Spec-Bench): export a run as Spec-Bench answer files, import answer
files as result rows. No torch; pandas and the standard library only.

Spec-Bench's answer files (written by ``evaluation/eval.py``, read by ``evaluation/speed.py``) are JSONL, one
file per method (``<model_id>.jsonl``), one line per question::

    {"question_id": 81, "category": "writing", "answer_id": "...", "model_id": "<model_id>",
     "choices": [{"index": 0, "turns": [answer text per turn], "decoding_steps": [per turn],
                  "new_tokens": [per turn], "wall_time": [seconds per turn],
                  "accept_lengths": [tokens emitted per step, all turns]}],
     "tstamp": 1700000000.0}

``speed.py`` reads ``choices[0]``: tokens/s of a question = sum(new_tokens) / sum(wall_time) for the method,
and for the baseline file the answer text re-tokenized (``len(tokenizer(turn).input_ids) - 1`` per turn);
speedup = mean tokens/s of the method / mean tokens/s of the baseline; tau = mean of ``accept_lengths``.

Export (:func:`export_answers`): one file per (run group, decoder configuration); vanilla's file is named
``<target>-vanilla-<dtype>-temp-<temperature>.jsonl`` like Spec-Bench's baseline files (``temp-0.0``
greedy). One choice per (run, repeat) of a question -- the seeds of a sampled run are runs of their own --
with our run id, repeat, sampling seed and equality check under ``harness_run``; ``decoding_steps`` is our
``num_steps`` (prefill included) and ``accept_lengths`` starts with
the prefill's 1 followed by (accepted + 1) per decode step, so its mean is our tau. Two extra keys, ignored by
Spec-Bench's scripts, make the round trip exact: ``harness`` on each line (our sample id, task, decoder,
hyper-parameters and run identity) and ``matches_vanilla`` in each choice (token-level equality per turn).

Import (:func:`import_answers`): rows in this harness's schema, one per (question, choice, turn), with
``source="spec_bench_import"`` in the run identity so they never pool with our own runs. The baseline file
becomes decoder ``vanilla`` (the file named by ``baseline``, else the one whose model_id contains
``vanilla`` or ``baseline``). Equality with vanilla is the ``matches_vanilla`` key when present, else equal
answer text. Wall times and new-token counts are taken as recorded (our definitions: tokens/s per turn).

Checks, each a one-line :class:`ValueError` naming the file, line, question and turn (``python -m harness.report``
prints it as ``error: ...`` with exit status 2): a choice without ``turns``, ``new_tokens`` or ``wall_time``, or
with fewer values than turns; a non-numeric value; a turn with an answer whose wall time is zero, negative or not
finite (its tokens/s is undefined: refused, never dropped). ``"ERROR"`` turns (a failed generation, as Spec-Bench's
``eval.py`` writes it) become ``status=error`` rows whatever their time. A folder holding answer files of several
of our runs (the ``harness`` key's ``group``) with the same model id is refused: importing it would mix them.

Export refuses a folder that already holds answer files (``*.jsonl``, searched as import searches) other than the
ones this export rewrites from the same run: importing the folder later would mix two runs (``replace=True``
rewrites the folder's answer files, removing the others).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from harness.rows.columns import SAMPLING, norm
from harness.rows.grouping import prepare

log = logging.getLogger(__name__)

SOURCE = "spec_bench_import"
IDENTITY_KEYS = ("task", "task_version", "model", "target_model", "draft_model", "dtype", "device_name",
                 "git_commit", "max_new_tokens", *SAMPLING)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", str(text)).strip("-") or "x"


def model_id(target: str, label: str, dtype: str | None, temperature: Any = 0.0) -> str:
    """Spec-Bench style model id: ``<target>-<configuration>-<dtype>-temp-<temperature>`` (``temp-0.0`` greedy)."""
    t = norm(temperature)
    return f"{_slug(target)}-{_slug(label)}-{_slug(dtype or 'unknown')}-temp-{float(t or 0.0):.1f}"


def _question_id(sample_id: str) -> Any:
    tail = str(sample_id).rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else str(sample_id)


def _accept_lengths(row: pd.Series) -> list[int]:
    new = norm(row.get("new_tokens")) or 0
    if row.get("decoder") == "vanilla":
        return [1] * int(new)
    acc = row.get("accepted_per_step")
    if isinstance(acc, (list, tuple)):
        return [1] + [int(a) + 1 for a in acc]
    return []


def _export_key(g: pd.DataFrame) -> str:
    """Which rows an answer file was exported from: a hash of the run ids of its run group (the same run
    exported again gives the same key; another run of the same configuration does not)."""
    runs = sorted({str(r) for r in g["run_id"]}) if "run_id" in g else []
    return hashlib.sha1("|".join(runs).encode()).hexdigest()[:12]


def _exported_from(path: Path) -> str | None:
    """The export key of an answer file (its first line's ``harness.export_of``), or ``None``."""
    try:
        with path.open(encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        return (json.loads(first).get("harness") or {}).get("export_of") if first else None
    except (OSError, ValueError, AttributeError):
        return None


def export_answers(rows: pd.DataFrame, out_dir: str | Path, replace: bool = False) -> list[Path]:
    """Write Spec-Bench answer files for every (run group, decoder configuration) of ``rows``.

    Args:
        rows: result rows (ok rows are exported; a failed cell's turn becomes ``"ERROR"`` as in Spec-Bench).
        out_dir: folder for the files (one sub-folder per run group when there are several).
        replace: remove the folder's other answer files instead of refusing them.

    Returns:
        The written files.

    Raises:
        ValueError: ``out_dir`` already holds answer files that this export would not rewrite from the same
            run (another run's, or foreign ones): reading the folder back would mix them. Nothing is written.
    """
    rows = prepare(rows)
    out = Path(out_dir)
    several = rows["group"].nunique() > 1
    plan: list[tuple[str, str, pd.DataFrame, Path]] = []
    keys = {str(group): _export_key(g) for group, g in rows.groupby("group", sort=False)}
    for (group, label), g in rows.groupby(["group", "label"], sort=False):
        first = g.iloc[0]
        mid = model_id(first.get("target_model") or first.get("model") or "model", label, first.get("dtype"),
                       first.get("temperature"))
        folder = out / _slug(group) if several else out
        plan.append((str(group), mid, g, folder / f"{mid}.jsonl"))
    targets = {path.resolve(): keys[group] for group, _, _, path in plan}
    existing = sorted(out.rglob("*.jsonl")) if out.is_dir() else []
    foreign = [f for f in existing if targets.get(f.resolve()) is None or _exported_from(f) != targets[f.resolve()]]
    if foreign and not replace:
        shown = ", ".join(str(f) for f in foreign[:3]) + (f" (+{len(foreign) - 3} more)" if len(foreign) > 3 else "")
        raise ValueError(f"{out} already holds Spec-Bench answer files of another run or export ({shown}); reading the "
                         "folder back would mix the runs: export into an empty folder, or remove those files")
    for f in foreign:
        f.unlink()
    written = []
    for group, mid, g, path in plan:
        first = g.iloc[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for sample_id, s in g.groupby("sample_id", sort=False):
            choices = []
            # one choice per (run, repeat): the seeds of a sampled run are runs of their own
            for index, ((run, repeat), c) in enumerate(s.groupby(["run_id", "repeat"], sort=True)):
                c = c.sort_values("turn")
                ok = c["status"] == "ok"
                choices.append({
                    "index": index,
                    "harness_run": {"run_id": str(run), "repeat": int(norm(repeat) or 0),
                                    "sampling_seed": norm(first_not_null(c, "sampling_seed")),
                                    "equality_check": first_not_null(c, "equality_check")},
                    "turns": [str(t) if k and isinstance(t, str) else ("" if k else "ERROR")
                              for t, k in zip(c.get("completion", pd.Series([None] * len(c))), ok)],
                    "decoding_steps": [int(norm(v) or 0) for v in c["num_steps"]],
                    "new_tokens": [int(norm(v) or 0) for v in c["new_tokens"]],
                    "wall_time": [float(norm(v) or 0.0) for v in c["wall_time_s"]],
                    "accept_lengths": [a for _, r in c.iterrows() for a in _accept_lengths(r)],
                    "matches_vanilla": [bool(v) if norm(v) is not None else None
                                        for v in c.get("matches_vanilla", pd.Series([None] * len(c)))],
                })
            harness = {k: norm(first.get(k)) for k in IDENTITY_KEYS if k in g}
            harness.update(sample_id=str(sample_id), decoder=str(first["decoder"]),
                           decoder_params=first.get("decoder_params"), run_id=str(first.get("run_id")),
                           group=group, export_of=keys[group])
            lines.append({
                "question_id": _question_id(sample_id),
                "category": str(first_not_null(s, "category") or first_not_null(s, "task") or ""),
                "answer_id": hashlib.sha1(f"{mid}|{sample_id}".encode()).hexdigest()[:22],
                "model_id": mid,
                "choices": choices,
                "tstamp": time.time(),
                "harness": harness,
            })
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        written.append(path)
    return written


def first_not_null(frame: pd.DataFrame, col: str) -> Any:
    if col not in frame:
        return None
    vals = frame[col].dropna()
    return vals.iloc[0] if len(vals) else None


def _answer_files(paths: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.rglob("*.jsonl")))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p} does not exist")
    if not files:
        raise FileNotFoundError(f"no Spec-Bench answer files (*.jsonl) under {', '.join(map(str, paths))}")
    return files


def _dtype_of(mid: str) -> str | None:
    for d in ("bfloat16", "float16", "float32"):
        if d in mid:
            return d
    return None


def import_answers(paths: Sequence[str | Path], baseline: str | None = None, task: str = "spec_bench",
                   target_model: str | None = None, device_name: str | None = None) -> pd.DataFrame:
    """Result rows from Spec-Bench answer files (see the module docstring).

    Args:
        paths: answer files, or folders searched recursively for ``*.jsonl``.
        baseline: model_id (or file stem) of the vanilla/baseline file; None = the one file whose model_id
            contains ``vanilla`` or ``baseline`` (or rows exported by this harness as ``vanilla``).
        task: task name for files without our ``harness`` key.
        target_model: target model name for such files (default: the baseline's model_id).
        device_name: hardware of such files (default ``unknown (Spec-Bench answer files)``).

    Returns:
        Rows with ``source = "spec_bench_import"``.

    Raises:
        FileNotFoundError: nothing to read. ValueError (one line): a file is not a Spec-Bench answer file, a
        choice lacks a per-turn list or holds a bad value (a wall time that is not positive, among others; see
        the module docstring), one model id comes from files of several runs, or the baseline cannot be told
        (the message lists the model ids).
    """
    files = _answer_files(paths)
    answers, where = _read_answers(files)
    problems = [p for mid, recs in answers.items() for rec in recs for p in _check_answer(rec, mid, where[id(rec)])]
    if problems:
        more = f" (and {len(problems) - 1} more such problems)" if len(problems) > 1 else ""
        raise ValueError(f"{problems[0]}{more}")
    base_ids = _baseline_ids(answers, baseline)
    base_mid = sorted(base_ids)[0]
    run_id = "sb-" + hashlib.sha1("|".join(sorted(map(str, files))).encode()).hexdigest()[:10]
    base_text: dict[tuple, str] = {}  # (sample_id, choice index, turn) -> the baseline's text
    rows: list[dict[str, Any]] = []
    for mid in sorted(answers, key=lambda m: (m not in base_ids, m)):
        for rec in answers[mid]:
            h = rec.get("harness") or {}
            ident = {k: h.get(k) for k in IDENTITY_KEYS if k in h}
            ident.setdefault("task", task)
            ident.setdefault("target_model", target_model or base_mid)
            ident.setdefault("dtype", _dtype_of(mid))
            ident.setdefault("device_name", device_name or "unknown (Spec-Bench answer files)")
            decoder = h.get("decoder") or ("vanilla" if mid in base_ids else mid)
            rows += _answer_rows(rec, mid, decoder, {"run_id": run_id, **ident}, base_text)
    frame = pd.DataFrame(rows)
    log.info("imported %d rows of %d Spec-Bench answer files (baseline %s)", len(frame), len(files), base_mid)
    return frame


def _read_answers(files: Sequence[Path]) -> tuple[dict[str, list[dict]], dict[int, str]]:
    """``(model_id -> answer records, id(record) -> "file line N")``; a torn last line is skipped with a warning.

    Raises:
        ValueError: a line is not a Spec-Bench answer, or one model id comes from files of several runs.
    """
    answers: dict[str, list[dict]] = {}
    where: dict[int, str] = {}
    sources: dict[str, list[tuple[Path, str | None]]] = {}  # model_id -> (file, the run group it was exported from)
    for f in files:
        lines = []
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s line %d is not JSON (torn last line?): skipped", f, i + 1)
                continue
            if not {"question_id", "choices", "model_id"} <= set(rec):
                raise ValueError(f"{f} line {i + 1} is not a Spec-Bench answer (needs question_id, choices, "
                                 f"model_id)")
            lines.append(rec)
            where[id(rec)] = f"{f} line {i + 1}"
        if lines:
            answers.setdefault(str(lines[0]["model_id"]), []).extend(lines)
            h0 = lines[0].get("harness") or {}
            group = h0.get("group") or (json.dumps({k: h0.get(k) for k in IDENTITY_KEYS}, sort_keys=True)
                                        if h0 else None)
            sources.setdefault(str(lines[0]["model_id"]), []).append((f, group))
    for mid, src in sources.items():
        groups = [g for _, g in src]
        if len(src) > 1 and (None in groups or len(set(groups)) < len(groups)):
            shown = ", ".join(str(f) for f, _ in src[:3]) + (", ..." if len(src) > 3 else "")
            raise ValueError(f"model_id {mid} comes from {len(src)} answer files ({shown}) of different runs: "
                             "importing them together would mix the runs; import one run's answer files at a time "
                             "(one folder per run)")
    return answers, where


def _baseline_ids(answers: dict[str, list[dict]], baseline: str | None) -> set[str]:
    """The model ids of the baseline (vanilla) files: ``baseline`` when given, else the files this harness
    exported as vanilla, else the one model id naming vanilla or baseline.

    Raises:
        ValueError: the baseline cannot be told (the message lists the model ids).
    """
    own = {mid for mid, ls in answers.items() if (ls[0].get("harness") or {}).get("decoder") == "vanilla"}
    if baseline is not None:
        base_ids = {m for m in answers if m == baseline or _slug(m) == _slug(baseline)}
        if not base_ids:
            raise ValueError(f"baseline {baseline!r} is none of the model ids {sorted(answers)}")
        return base_ids
    if own:  # files exported by this harness: each run group has its own vanilla file
        return own
    base_ids = {m for m in answers if re.search("vanilla|baseline", m, re.I)}
    if len(base_ids) != 1:
        raise ValueError(f"cannot tell the baseline (vanilla) file among {sorted(answers)}: pass "
                         f"baseline=<model_id> (--spec-bench-baseline)")
    return base_ids


def _answer_rows(rec: dict[str, Any], mid: str, decoder: str, ident: dict[str, Any],
                 base_text: dict[tuple, str]) -> list[dict[str, Any]]:
    """One row per choice and turn of answer record ``rec`` (``ident``: run id and identity columns). Equality
    with vanilla is the file's own ``matches_vanilla``, else the text compared with the baseline's (recorded in
    ``base_text`` when ``decoder`` is vanilla, which is read first); a sampled run makes no token claim."""
    h = rec.get("harness") or {}
    run_id = ident.pop("run_id")
    sample_id = h.get("sample_id") or str(rec["question_id"])
    rows = []
    for choice in rec["choices"]:
        turns = choice.get("turns") or []
        steps = choice.get("decoding_steps") or [None] * len(turns)
        accs = list(choice.get("accept_lengths") or [])
        split = sum(s or 0 for s in steps) == len(accs) and all(s is not None for s in steps)
        hr = choice.get("harness_run") or {}
        offset = 0
        for j, text in enumerate(turns):
            new = int(choice["new_tokens"][j])
            wall = float(choice["wall_time"][j])
            n_steps = steps[j] if j < len(steps) else None
            key = (sample_id, int(choice.get("index", 0)), j)
            if decoder == "vanilla":
                base_text[key] = text
            eq = (choice.get("matches_vanilla") or [None] * len(turns))[j] \
                if j < len(choice.get("matches_vanilla") or []) else None
            sampled = str(hr.get("equality_check", "")).startswith("n/a")
            if eq is None and not sampled:  # a sampled run makes no token claim
                eq = True if decoder == "vanilla" else (text == base_text[key] if key in base_text else None)
            per_step = accs[offset:offset + n_steps] if split else None
            offset += n_steps or 0
            own_run = hr.get("run_id") or h.get("run_id")
            row = {
                "run_id": own_run and f"{run_id}-{own_run}" or run_id,
                **ident, "source": SOURCE, "sample_id": sample_id, "turn": j,
                "repeat": int(hr.get("repeat", choice.get("index", 0))), "category": rec.get("category"),
                **({k: hr[k] for k in ("sampling_seed", "equality_check") if hr.get(k) is not None}),
                "decoder": decoder, "decoder_params": h.get("decoder_params") or "{}",
                "new_tokens": new, "num_steps": n_steps, "wall_time_s": wall,
                "tokens_per_s": new / wall if wall > 0 else None,
                "accept_length": new / n_steps if n_steps else None,
                "accepted_per_step": [a - 1 for a in per_step[1:]] if per_step and decoder != "vanilla" else None,
                "matches_vanilla": eq, "completion": text,
                "status": "error" if text == "ERROR" else "ok", "spec_bench_model_id": mid,
            }
            params = row["decoder_params"]
            for k, v in (json.loads(params) if isinstance(params, str) else {}).items():
                row.setdefault(k, v)
            rows.append(row)
    return rows


def _check_answer(rec: dict[str, Any], mid: str, loc: str) -> list[str]:
    """The problems of one answer line (see the module docstring), each a sentence naming where it is."""
    out = []
    choices = rec.get("choices")
    if not isinstance(choices, list) or not choices:
        return [f"{loc} (question {rec.get('question_id')}, model_id {mid}): `choices` is not a non-empty list"]
    for c, choice in enumerate(choices):
        at = f"{loc} (question {rec.get('question_id')}, choice {c}, model_id {mid})"
        turns = choice.get("turns") if isinstance(choice, dict) else None
        if not isinstance(turns, list):
            out.append(f"{at}: no `turns` list; a Spec-Bench answer records the answer text per turn")
            continue
        for key in ("new_tokens", "wall_time"):
            vals = choice.get(key)
            if not isinstance(vals, list):
                out.append(f"{at}: no `{key}` list; a Spec-Bench answer records one value per turn "
                           "(evaluation/eval.py), and tokens/s needs both new_tokens and wall_time")
            elif len(vals) < len(turns):
                out.append(f"{at}: {len(vals)} `{key}` values for {len(turns)} turns; one per turn is needed")
        if out:
            continue
        for j, text in enumerate(turns):
            try:
                new, wall = int(choice["new_tokens"][j]), float(choice["wall_time"][j])
            except (TypeError, ValueError):
                out.append(f"{at}, turn {j}: new_tokens {choice['new_tokens'][j]!r} / wall_time "
                           f"{choice['wall_time'][j]!r} are not numbers")
                continue
            if text == "ERROR":  # a failed generation: a status=error row, whatever its time
                continue
            if new < 0:
                out.append(f"{at}, turn {j}: new_tokens {new} is negative")
            if not (math.isfinite(wall) and wall > 0):
                out.append(f"{at}, turn {j}: wall_time {wall!r} is not a positive time, so its tokens/s is undefined; "
                           "fix or remove this answer (it is not dropped silently)")
    return out


def spec_bench_speed(method_file: str | Path, baseline_file: str | Path) -> dict[str, float]:
    """Spec-Bench ``speed.py``'s figures for one method file against a baseline file, with the baseline's
    recorded ``new_tokens`` standing in for re-tokenizing its text (``speed.py`` needs the tokenizer).

    Returns:
        ``{"tokens_per_s", "tokens_per_s_baseline", "speedup", "mean_accept_length"}`` (ratio of means, as
        ``speed.py``).
    """
    def read(p: str | Path) -> list[dict]:
        recs = [json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()]
        problems = [x for i, r in enumerate(recs)
                    for x in _check_answer(r, str(r.get("model_id")), f"{p} record {i + 1}")]
        if problems:
            more = f" (and {len(problems) - 1} more such problems)" if len(problems) > 1 else ""
            raise ValueError(problems[0] + more)
        return recs

    method, base = read(method_file), read(baseline_file)
    speeds = [sum(d["choices"][0]["new_tokens"]) / sum(d["choices"][0]["wall_time"]) for d in method]
    accept = [a for d in method for a in d["choices"][0]["accept_lengths"]]
    speeds0 = [sum(d["choices"][0]["new_tokens"]) / sum(d["choices"][0]["wall_time"]) for d in base]
    mean = sum(speeds) / len(speeds)
    mean0 = sum(speeds0) / len(speeds0)
    return {"tokens_per_s": mean, "tokens_per_s_baseline": mean0, "speedup": mean / mean0,
            "mean_accept_length": sum(accept) / len(accept) if accept else math.nan}
