"""The synthetic-query pipeline: sample documents, Stage A, Stage B, parse, retry, write rows, resume.

The OBLIQ-IR paper (§3.1, §4 "Training data") synthesises one query per sampled document of a task
through the task's lens. Here:

1. **Sampling**: the task's non-empty documents, shuffled with ``random.Random(seed)``; the first
   ``n_docs`` (all when ``None``). The order is a function of the seed and corpus alone, so a rerun
   with a larger ``n_docs`` extends the same sample. A shard (:mod:`obliq.shards`) takes every
   ``count``-th document of it; ``obliq synth merge`` joins the shards back.
2. **Resume**: the output is an append-only JSONL of training rows keyed by the positive's document
   id and the row's sample (``meta.sample``, 0 when absent). Candidates already in it are not
   generated again (a document whose samples are all there is skipped). A last line without its newline is kept when
   it is a complete row and cut off when it is a half-written one (a killed run); any other bad line is
   an error naming file, line and field.
3. **Samples** (best-of-n): each document gets ``samples`` candidates, each a whole draw of the
   pipeline (Stage A, few-shot examples, Stage B) with its own seeds; ``obliq synth filter`` keeps the
   best (:mod:`obliq.synth.filter`). Sample 0 of a document is keyed by its id alone, sample ``i >= 1``
   by ``<doc id>:<i>``, so one sample per document is the single-sample run, and raising ``samples``
   extends an earlier output (resume keeps what is there).
4. **Few-shot Stage B** (Promptagator, Dai et al. 2022, §3: a handful of real (document, query) pairs
   in the prompt; InPars likewise): with ``fewshot.k`` > 0, each candidate's Stage B prompt shows ``k``
   real pairs of the task's **development** side (``queries-<split>.jsonl`` + ``qrels/<split>.tsv``, as
   ``obliq task split`` writes them; never ``queries.jsonl``, the test side: :class:`~obliq.synth.fewshot.ExamplePool`).
   The examples are drawn per document from the run's seed (a document's candidates see the same ones,
   and differ by their Stage A description: their Stage B prompts then share every token before the
   description, which comes last, so a backend that keeps prompt prefixes evaluates it once): ``k``
   distinct development queries, then one gold document of each. A query whose gold set holds the source
   document (or a copy of its text) is never shown: the generated query would then be a paraphrase of a
   real development query that is relevant to its own source, a development label leaking into training.
   A reply that copies an example (its query or document as shown, :func:`obliq.synth.parse.copies`)
   is rejected as ``copied-example`` and retried like any other rejected reply.
5. **Generation**, in rounds of ``candidates_per_round`` candidates: Stage A for the round, then Stage B
   for the candidates with a description; each candidate's seeds derive from the run's seed and its own key
   (not its round's). The backend decodes a stage's chats of a round together as far as its own setting
   lets it (``backend.batch_size``: chats per ``generate`` call, or decoded together; vLLM: all).
   A reply that :func:`obliq.synth.parse.parse_reply` rejects is generated again (new seed) up to
   ``max_retries`` times (a Stage B reply cut by the token limit is rejected as overlong; a Stage A reply
   keeps its finished sentences), then the candidate is skipped and counted. Every rejected reply is
   appended to ``<out>.rejects.jsonl`` (document, sample, stage, attempt, reason, reply).
6. **Rows** (docs/formats.md format, checked with :func:`obliq.data.rows.parse_row`) are appended and
   flushed after every round: ``id`` = ``synth:<task>:<doc id>`` (sample 0) or
   ``synth:<task>:<doc id>:<i>``, ``source`` = ``synthetic``, ``negatives`` = ``[]`` (``obliq negatives
   mine`` fills them), ``lens``, the task's ``instruction`` when set, and ``meta`` = the Stage A
   ``description``, the generator, seed, ``sample``, attempts and, with few-shot, ``fewshot``: the
   examples shown (``query_id``, ``doc_id``).

A run returns (and saves as ``<out>.report.json``) :class:`SynthReport`, with its cost: new and prompt
tokens, seconds, and both per row written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from dataclasses import InitVar, dataclass, field
from pathlib import Path

from obliq.data.rows import RowError, parse_row
from obliq.llm.backends import Backend, ask
from obliq.llm.prompts import PromptTemplate, cut_words
from obliq.llm.reply import chat_markers
from obliq.shards import Shard
from obliq.synth.fewshot import ExamplePool, FewShotConfig
from obliq.synth.parse import REJECT_REASONS, parse_reply
from obliq.synth.prompts import TaskSpec, load_stage_prompt, render_stage, takes_examples
from obliq.tasks import Task
from obliq.text import words

log = logging.getLogger(__name__)


@dataclass
class GenerationConfig:
    """Generation settings shared by both stages.

    Attributes:
        max_new_tokens_a: token limit of a Stage A reply.
        max_new_tokens_b: token limit of a Stage B reply.
        temperature: sampling temperature (0 = greedy).
        max_retries: extra attempts for a rejected reply before the document is skipped.
        candidates_per_round: candidates generated together, Stage A then Stage B, and appended to the
            output at once (what a killed run loses at most; the backend's own setting says how many chats
            it decodes together).
        max_doc_words: documents are cut to this many whitespace words in the prompts.
        description_words: accepted length of a Stage A description, ``[min, max]`` words.
        query_words: accepted length of a Stage B query, ``[min, max]`` words.
        copy_ngram: a reply sharing this many consecutive words with its document (or with a few-shot
            example) is rejected; so is one equal to it, normalised (0: only that).
        batch_size: ``candidates_per_round``'s old name, refused with a line naming it (the backend has a
            ``batch_size`` of its own).
    """

    max_new_tokens_a: int = 96
    max_new_tokens_b: int = 64
    temperature: float = 0.7
    max_retries: int = 3
    candidates_per_round: int = 8
    max_doc_words: int = 300
    description_words: tuple[int, int] = (5, 80)
    query_words: tuple[int, int] = (4, 40)
    copy_ngram: int = 8
    batch_size: InitVar[int | None] = None

    def __post_init__(self, batch_size: int | None) -> None:
        if batch_size is not None:
            raise ValueError("generation.batch_size: renamed generation.candidates_per_round")
        for key in ("max_new_tokens_a", "max_new_tokens_b", "candidates_per_round", "max_doc_words"):
            if getattr(self, key) < 1:
                raise ValueError(f"generation.{key}: must be at least 1, got {getattr(self, key)}")
        if self.max_retries < 0 or self.temperature < 0 or self.copy_ngram < 0:
            raise ValueError("generation: max_retries, temperature and copy_ngram must be >= 0")
        for key in ("description_words", "query_words"):
            lo, hi = getattr(self, key)
            if not 1 <= lo <= hi:
                raise ValueError(f"generation.{key}: need 1 <= min <= max, got {[lo, hi]}")


@dataclass
class SynthReport:
    """Counts of one ``generate`` run.

    Attributes:
        task, lens, backend: what ran.
        sampled: documents in the sample (after excluding empty ones).
        samples: candidates per document (best-of-n).
        candidates: ``sampled × samples``: the rows a complete run holds, less the skipped ones.
        empty_docs_excluded: corpus documents with no text, never sampled.
        already_done: candidates found in the output (resume).
        generated: rows (candidates) written by this run.
        skipped: candidates given up after all retries, by stage (``{"A": n, "B": n}``).
        retries: extra attempts made (replies generated beyond the first per candidate and stage).
        docs_retried: candidates that needed at least one retry.
        replies: replies read, by stage (``{"A": n, "B": n}``), retries included.
        rejected: rejected replies by ``<stage>:<reason>`` (see :data:`obliq.synth.parse.REJECT_REASONS`).
        truncated_docs: documents cut to ``max_doc_words`` in the prompts.
        mean_query_words, mean_description_words: over the rows written by this run.
        new_tokens, generation_seconds, tokens_per_s: the backend's output and time (both stages,
            retries included).
        prompt_tokens: tokens the backend read (its prompts; 0 when it does not count them).
        prompt_tokens_evaluated: of those, the tokens the model computed (a backend that keeps prompt
            prefixes, llamacpp, serves the rest from its cache; None: the backend does not say).
        new_tokens_per_row, seconds_per_row: the cost of one row written by this run (0 without rows).
        fewshot: ``k``, ``split``, ``queries`` (development queries in the pool) and ``short`` (Stage B
            prompts shown fewer than ``k`` examples: too few eligible queries); empty when ``k`` is 0.
        reasoning: whether the model was let reason (its budget then grew by its ``reasoning_tokens``).
        reasoning_replies: replies that held a reasoning block (removed before parsing).
        dropped_partial_line: whether a half-written last line was cut from the output.
    """

    task: str = ""
    lens: str = ""
    backend: str = ""
    sampled: int = 0
    samples: int = 1
    candidates: int = 0
    empty_docs_excluded: int = 0
    already_done: int = 0
    generated: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})
    retries: int = 0
    docs_retried: int = 0
    replies: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})
    rejected: dict[str, int] = field(default_factory=dict)
    truncated_docs: int = 0
    mean_query_words: float = 0.0
    mean_description_words: float = 0.0
    new_tokens: int = 0
    generation_seconds: float = 0.0
    tokens_per_s: float = 0.0
    prompt_tokens: int = 0
    prompt_tokens_evaluated: int | None = None
    new_tokens_per_row: float = 0.0
    seconds_per_row: float = 0.0
    fewshot: dict = field(default_factory=dict)
    reasoning: bool = False
    reasoning_replies: int = 0
    dropped_partial_line: bool = False
    shard: dict = field(default_factory=lambda: {"index": 0, "count": 1})
    documents: list[str] = field(default_factory=list)
    """The documents of this run's sample (its shard's), in sample order: what a merge checks."""


def sample_documents(task: Task, n_docs: int | None, seed: int) -> tuple[list[int], int]:
    """Seeded sample of a task's non-empty documents.

    Returns:
        ``(indices into task.doc_ids, number of empty documents excluded)``; all non-empty
        documents (shuffled) when ``n_docs`` is None or at least their number.

    Raises:
        ValueError: ``n_docs`` < 1.
    """
    if n_docs is not None and n_docs < 1:
        raise ValueError(f"n_docs must be at least 1 (or null for all), got {n_docs}")
    keep = [i for i, t in enumerate(task.doc_texts) if t.strip()]
    random.Random(seed).shuffle(keep)
    return (keep if n_docs is None else keep[:n_docs]), len(task.doc_texts) - len(keep)


def read_done(out: Path, task_name: str) -> tuple[set[tuple[str, int]], bool]:
    """Candidates already in an output file, cutting a half-written last line.

    Every complete line must be a synthetic row (``source: synthetic``) of the same task, checked before
    the file is touched: another command's file (kNN rows, a report) is refused, never appended to or
    cut. A last line without its newline is then either complete (a valid row: the newline is added
    and the row kept) or a killed run's partial write (cut off; its document is generated again) —
    cut only when the file is evidently this command's (rows before it, or recorded as written by
    ``synth generate``).

    Returns:
        ``({(document id, sample)} done, whether a partial line was removed)``; a row without
        ``meta.sample`` is sample 0.

    Raises:
        obliq.data.rows.RowError: a complete line is not a valid row (file:line:field).
        ValueError: a row of another task or source; a lone unreadable line in a file of unknown origin.
    """
    from obliq.claims import output_owner

    if not out.is_file():
        return set(), False
    data = out.read_bytes()

    def check(raw: bytes, lineno: int) -> tuple[str, int]:
        row = parse_row(raw, str(out), lineno)
        if row.task != task_name:
            raise ValueError(
                f"{out}:{lineno}:task: row of task {row.task!r}, this run is {task_name!r}; "
                "use one output file per task"
            )
        if row.source != "synthetic":
            raise ValueError(
                f"{out}:{lineno}:source: a {row.source!r} row: {out} is not synthetic rows (another command's "
                "file); give synth generate its own output"
            )
        sample = (row.meta or {}).get("sample", 0)
        return row.positive.id, sample if isinstance(sample, int) else 0

    lines = data.split(b"\n")
    complete, last = lines[:-1], lines[-1]
    done = {check(raw, n) for n, raw in enumerate(complete, 1) if raw.strip()}
    cut = False
    if last.strip():
        try:
            done.add(check(last, len(complete) + 1))
        except RowError:  # a partial write: cut it, its document is generated again
            if not done and output_owner(out) != "synth generate":
                raise ValueError(
                    f"{out}:{len(complete) + 1}: not a training row, and nothing shows {out} is synth "
                    "generate's output: refusing to cut it"
                ) from None
            keep = len(data) - len(last)
            with out.open("r+b") as f:
                f.truncate(keep)
            log.warning("%s: removed a half-written last line (%d bytes) left by a killed run", out, len(last))
            cut = True
        else:  # complete but for its newline: keep it
            with out.open("ab") as f:
                f.write(b"\n")
    return done, cut


def candidate_key(doc_id: str, sample: int) -> str:
    """A candidate's key (its seeds' and row id's): the document id for sample 0, ``<doc id>:<i>`` after."""
    return doc_id if sample == 0 else f"{doc_id}:{sample}"


def _seed(base: int, stage: str, attempt: int, doc_id: str) -> int:
    """A candidate's own generation seed (``doc_id``: its :func:`candidate_key`): the same whichever
    round or shard the candidate falls in."""
    key = f"{base}:{stage}:{attempt}:{doc_id}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")


class _Stage:
    """Generate one stage for a round's candidates with retries; collects counts into the report."""

    def __init__(
        self, name: str, backend: Backend, cfg: GenerationConfig, report: SynthReport, rejects, prompt: PromptTemplate
    ):
        self.name, self.backend, self.cfg, self.report, self.rejects = name, backend, cfg, report, rejects
        self.instructions = prompt.instructions()
        self.tag = "description" if name == "A" else "query"
        self.max_tokens = cfg.max_new_tokens_a if name == "A" else cfg.max_new_tokens_b
        self.lo, self.hi = cfg.description_words if name == "A" else cfg.query_words
        self.markers = chat_markers(getattr(backend, "tokenizer", None))

    def run(
        self,
        doc_ids: list[str],
        prompts: list,
        docs: list[str],
        seed: int,
        owners: list[tuple[str, int]] | None = None,
        examples: list[list[str]] | None = None,
    ) -> tuple[dict[str, str], dict[str, int]]:
        """Generate for candidates keyed by ``doc_ids`` (:func:`candidate_key`); ``owners`` their
        (document id, sample) for the rejects file, ``examples`` the example texts each prompt showed."""
        owners = owners or [(d, 0) for d in doc_ids]
        results: dict[str, str] = {}
        attempts: dict[str, int] = {}
        todo = list(range(len(doc_ids)))
        for attempt in range(self.cfg.max_retries + 1):
            if not todo:
                break
            if attempt:
                self.report.retries += len(todo)
            ids = [doc_ids[i] for i in todo]
            replies = ask(
                self.backend,
                [prompts[i] for i in todo],
                self.max_tokens,
                self.cfg.temperature,
                [_seed(seed, self.name, attempt, d) for d in ids],
            )
            failed = []
            for i, reply in zip(todo, replies):
                attempts[doc_ids[i]] = attempt + 1
                self.report.replies[self.name] += 1
                self.report.reasoning_replies += reply.reasoning
                parsed = parse_reply(
                    reply.text,
                    self.tag,
                    self.lo,
                    self.hi,
                    docs[i],
                    self.cfg.copy_ngram,
                    whole_sentences=self.name == "A",
                    truncated=not reply.finished,
                    instructions=self.instructions,
                    examples=examples[i] if examples else (),
                    markers=self.markers,
                )
                if parsed.ok:
                    results[doc_ids[i]] = parsed.text
                    continue
                failed.append(i)
                key = f"{self.name}:{parsed.reason}"
                self.report.rejected[key] = self.report.rejected.get(key, 0) + 1
                self.rejects.write(
                    json.dumps(
                        {
                            "doc_id": owners[i][0],
                            "sample": owners[i][1],
                            "stage": self.name,
                            "attempt": attempt + 1,
                            "reason": parsed.reason,
                            "reply": reply.raw,
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
            todo = failed
        self.report.skipped[self.name] += len(todo)
        return results, attempts


def synthesize(
    task: Task,
    spec: TaskSpec,
    backend: Backend,
    out: str | os.PathLike,
    n_docs: int | None = 100,
    seed: int = 13,
    generation: GenerationConfig | None = None,
    prompt_dir: str | os.PathLike | None = None,
    shard: Shard = Shard(0, 1),
    fewshot: FewShotConfig | None = None,
    samples: int = 1,
) -> SynthReport:
    """Generate synthetic training rows for a task, appending to ``out`` (resumable).

    Args:
        task: the loaded task (:func:`obliq.tasks.load_task`).
        spec: the task's lens and wording (:class:`obliq.synth.prompts.TaskSpec`).
        backend: a generator (:mod:`obliq.llm.backends`).
        out: the output JSONL of training rows (appended; see the module notes on resuming).
        n_docs: documents to sample, or None for all.
        seed: sampling seed; generation seeds derive from it.
        generation: generation settings (defaults: :class:`GenerationConfig`).
        prompt_dir: a folder of prompt files replacing the packaged ones.
        shard: generate for this shard of the sample only (:class:`obliq.shards.Shard`, resolved);
            every document's seeds are its own, so merged shards give a single run's rows (with a
            backend that seeds each chat: vLLM, or transformers with ``backend.batch_size`` 1 or greedy).
        fewshot: few-shot Stage B settings (:class:`~obliq.synth.fewshot.FewShotConfig`; default none).
        samples: candidates per document (best-of-n), at least 1.

    Returns:
        The :class:`SynthReport` of this run (also written to ``<out>.report.json`` by the command).

    Raises:
        RowError, ValueError: a bad existing output file (see :func:`read_done`); a prompt file error;
            few-shot examples asked of a prompt without ``{examples}``; ``samples`` < 1; two candidates
            with one row id.
        FileNotFoundError: few-shot examples asked of a task without a development side.
    """
    cfg = generation or GenerationConfig()
    fewshot = fewshot or FewShotConfig()
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples: must be an integer >= 1, got {samples!r}")
    prompt_a, prompt_b = (
        load_stage_prompt("A", prompt_dir=prompt_dir),
        load_stage_prompt("B", spec.lens, prompt_dir=prompt_dir),
    )
    pool = None
    if fewshot.k:
        if not takes_examples(prompt_b):
            raise ValueError(
                f"{prompt_b.path}: fewshot.k is {fewshot.k} but the prompt cannot show examples "
                "(it needs an `example` template and an {examples} field in user)"
            )
        pool = ExamplePool(task, fewshot.split, fewshot.max_doc_words)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = SynthReport(
        task=spec.name, lens=spec.lens, backend=backend.name, reasoning=bool(getattr(backend, "reasoning", False))
    )
    order, report.empty_docs_excluded = sample_documents(task, n_docs, seed)
    order = shard.select(order)
    report.shard, report.documents = {"index": shard.index, "count": shard.count}, [task.doc_ids[i] for i in order]
    report.sampled, report.samples, report.candidates = len(order), samples, len(order) * samples
    if pool is not None:
        report.fewshot = {"k": fewshot.k, "split": fewshot.split, "queries": len(pool.queries), "short": 0}
    keys = [candidate_key(task.doc_ids[i], s) for i in order for s in range(samples)]
    if len(set(keys)) != len(keys):
        clash = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"two candidates of the sample have the row key {clash!r} (a document id ending in :<n>)")
    done, report.dropped_partial_line = read_done(out, spec.name)
    todo = [(i, s) for i in order for s in range(samples) if (task.doc_ids[i], s) not in done]
    report.already_done = report.candidates - len(todo)
    tokens0, seconds0 = backend.new_tokens, backend.seconds
    prompt_tokens0 = getattr(backend, "prompt_tokens", 0)
    evaluated0 = getattr(backend, "evaluated_tokens", None)
    q_words, d_words, retried, truncated = [], [], set(), set()
    rejects_path = out.with_name(out.name + ".rejects.jsonl")
    with out.open("a", encoding="utf-8") as sink, rejects_path.open("a", encoding="utf-8") as rejects:
        stage_a = _Stage("A", backend, cfg, report, rejects, prompt_a)
        stage_b = _Stage("B", backend, cfg, report, rejects, prompt_b)
        for start in range(0, len(todo), cfg.candidates_per_round):
            part = todo[start : start + cfg.candidates_per_round]
            ids = [candidate_key(task.doc_ids[i], s) for i, s in part]
            owners = [(task.doc_ids[i], s) for i, s in part]
            docs = []
            for i, _ in part:
                text, cut = cut_words(task.doc_texts[i], cfg.max_doc_words)
                docs.append(text)
                if cut:
                    truncated.add(i)
            descriptions, tries_a = stage_a.run(
                ids, [render_stage(prompt_a, spec, d) for d in docs], docs, seed, owners
            )
            keep = [n for n, d in enumerate(ids) if d in descriptions]
            shown = {
                ids[n]: pool.choose(part[n][0], fewshot.k, _seed(seed, "fewshot", 0, owners[n][0])) if pool else []
                for n in keep
            }
            if pool is not None:
                report.fewshot["short"] += sum(len(shown[ids[n]]) < fewshot.k for n in keep)
            queries, tries_b = stage_b.run(
                [ids[n] for n in keep],
                [
                    render_stage(
                        prompt_b, spec, docs[n], descriptions[ids[n]], [(e.document, e.query) for e in shown[ids[n]]]
                    )
                    for n in keep
                ],
                [docs[n] for n in keep],
                seed,
                [owners[n] for n in keep],
                [[t for e in shown[ids[n]] for t in (e.query, e.document)] for n in keep],
            )
            retried.update(d for d, t in tries_a.items() if t > 1)
            retried.update(d for d, t in tries_b.items() if t > 1)
            lines = []
            for n, (i, sample) in enumerate(part):
                key, doc_id = ids[n], task.doc_ids[i]
                if key not in queries:
                    continue
                meta = {
                    "description": descriptions[key],
                    "generator": backend.name,
                    "seed": seed,
                    "sample": sample,
                    "attempts": {"A": tries_a[key], "B": tries_b[key]},
                }
                if pool is not None:
                    meta["fewshot"] = [{"query_id": e.query_id, "doc_id": e.doc_id} for e in shown[key]]
                row = {
                    "id": f"synth:{spec.name}:{key}",
                    "task": spec.name,
                    "source": "synthetic",
                    "query": queries[key],
                    "positive": {"id": doc_id, "text": task.doc_texts[i]},
                    "negatives": [],
                    "lens": spec.lens,
                    **({"instruction": spec.instruction} if spec.instruction else {}),
                    "meta": meta,
                }
                line = json.dumps(row, ensure_ascii=False)
                try:
                    parse_row(line, str(out), 0)
                except RowError as err:  # a bug, not bad model output: every field was checked above
                    raise RuntimeError(f"generated an invalid row for {key}: {err}") from err
                lines.append(line + "\n")
                q_words.append(len(words(queries[key])))
                d_words.append(len(words(descriptions[key])))
            sink.write("".join(lines))
            sink.flush()
            rejects.flush()
            report.generated += len(lines)
            log.info(
                "%s: %d/%d candidates, %d rows written, %d skipped",
                spec.name,
                start + len(part),
                len(todo),
                report.generated,
                sum(report.skipped.values()),
            )
    report.truncated_docs = len(truncated)
    report.docs_retried = len(retried)
    report.mean_query_words = sum(q_words) / len(q_words) if q_words else 0.0
    report.mean_description_words = sum(d_words) / len(d_words) if d_words else 0.0
    report.new_tokens = backend.new_tokens - tokens0
    report.generation_seconds = backend.seconds - seconds0
    report.prompt_tokens = getattr(backend, "prompt_tokens", 0) - prompt_tokens0
    if evaluated0 is not None:
        report.prompt_tokens_evaluated = backend.evaluated_tokens - evaluated0
    report.tokens_per_s = report.new_tokens / report.generation_seconds if report.generation_seconds > 0 else 0.0
    if report.generated:
        report.new_tokens_per_row = report.new_tokens / report.generated
        report.seconds_per_row = report.generation_seconds / report.generated
    report.rejected = {k: report.rejected[k] for k in sorted(report.rejected)}
    return report


__all__ = [
    "GenerationConfig",
    "REJECT_REASONS",
    "SynthReport",
    "candidate_key",
    "read_done",
    "sample_documents",
    "synthesize",
]
