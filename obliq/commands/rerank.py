"""``obliq rerank …``: rerank a TREC run with a language model, and choose the per-task policy.

A typical session (dense runs from evaluate.py, then the policy chosen on development queries, then
the test numbers with it)::

    python evaluate.py --model minilm --tasks ../shared/data/tasks --output runs/minilm
    obliq rerank policy --tasks '[../shared/data/tasks]' --runs runs/minilm --out runs/policy.yaml \\
        --base configs/rerank/cpu-smollm2.yaml
    python evaluate.py --model minilm --tasks ../shared/data/tasks --output runs/minilm+rerank \\
        --rerank runs/policy.yaml
    obliq rerank run ../shared/data/tasks/math-theoremqa runs/minilm/math-theoremqa/run.trec \\
        runs/math.tourrank.trec --method tourrank --queries 5
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Literal

from obliq.claims import claim_outputs
from obliq.errors import check_int
from obliq.eval.metrics import evaluate_run, parse_measures
from obliq.files import safe_name, write_json
from obliq.rerank.config import RerankConfig, dump_policy, load_policy
from obliq.rerank.reranker import Reranker, queries_to_rerank
from obliq.search.runs import read_run, write_run
from obliq.tasks import find_tasks, load_task

log = logging.getLogger(__name__)

Method = Literal["identity", "tourrank", "listwise"]


def run(
    task: Path,
    run: Path,
    out: Path,
    policy: Path | None = None,
    method: Method | None = None,
    queries: int | None = None,
    measures: list[str] = ["NDCG@10", "Recall@10"],
    overwrite: bool = False,
) -> dict:
    """Rerank a task's TREC run (its top ``depth`` per query) and score it before and after.

    Writes the reranked run to ``out`` (TREC format; only the reranked queries) and a report with the
    gold metrics of the dense and the reranked run on those queries, the prompt file used and the
    cost (language-model calls, tokens in/out, seconds; totals and per query) to ``<out>.report.json``.

    Args:
        task: the task folder (BEIR layout).
        run: its dense run (TREC format), e.g. ``<evaluate output>/<task>/run.trec``; it must hold
            queries of the task, and their documents must be in its corpus.
        out: the reranked run to write.
        policy: a policy file (configs/rerank/…); default the built-in settings (SmolLM2 on CPU).
        method: ``tourrank``, ``listwise`` or ``identity``; default the policy's entry for the task.
            Needed when the policy does not name the task (or without ``policy``): the command
            refuses rather than write the dense order as a "reranked" run.
        queries: rerank only the first this many queries of the task found in the run.
        measures: metrics reported, e.g. ``[NDCG@10,Recall@10]``.
        overwrite: replace an existing ``out`` (refused otherwise; ``out`` may never be ``run``, the
            policy or a file of the task).

    Returns:
        The report.
    """
    report_file = Path(out).with_name(Path(out).name + ".report.json")
    # never the run, the policy, the task's qrels, corpus …
    with claim_outputs(
        {"out": out, "report": report_file},
        command="rerank run",
        inputs=[run, policy, task],
        overwrite=overwrite,
        what="a reranked run",
    ):
        cfg = load_policy(policy) if policy is not None else RerankConfig()
        parse_measures(measures)
        if queries is not None:
            check_int("queries", queries, 1)
        data = load_task(task)
        if method is None:
            if data.name not in cfg.tasks:
                raise ValueError(
                    f"{policy or 'the built-in policy (no --policy)'}: tasks: no entry for task {data.name}; "
                    "pass --method tourrank, listwise or identity"
                )
            method = cfg.tasks[data.name]
        prompt = cfg.prompt(method, data.name).path if method != "identity" else None  # a bad prompt fails first
        dense = read_run(run)
        ids = queries_to_rerank(data, dense, source=run)[:queries]
        reranked, stats = Reranker(cfg).rerank_run(data, dense, method, ids)
        out = Path(out)
        write_run(out, reranked, tag=method, task=data)
        gold = data.qrels["test"]
        report = {
            "task": data.name,
            "method": method,
            "depth": cfg.depth,
            "n_queries": len(ids),
            "backend": f"{cfg.backend.name}:{cfg.backend.model}",
            "prompt": prompt,
            "metrics": {
                "dense": evaluate_run(gold, {q: dense[q] for q in ids}, measures, ids).aggregate,
                method: evaluate_run(gold, reranked, measures, ids).aggregate,
            },
            "cost": stats.as_dict(),
            "args": {"task": str(task), "run": str(run), "policy": str(policy) if policy else None, "queries": queries},
        }
        write_json(report_file, report)
        return report


def _development(path: Path, runs: Path, split: str, dev_queries: int, seed: int) -> tuple:
    """One task's development set for :func:`policy`, checked before any call.

    Returns:
        ``(task, qrels, dense run, query ids, record)``: the ids are the development queries the run
        holds; ``record`` starts the task's ``dev`` entry (qrels, run file, drawn and missing ids).

    Raises:
        FileNotFoundError: no dense run.
        ValueError: the run fails :func:`obliq.rerank.reranker.queries_to_rerank`, or holds none of the
            development queries.
    """
    has_dev = (path / "qrels" / f"{split}.tsv").is_file()
    data = load_task(path, splits=(split,) if has_dev else ("test",))
    qrels = data.qrels[split if has_dev else "test"]
    judged = [q for q in data.query_ids if any(g > 0 for g in qrels.get(q, {}).values())]
    record: dict = {"qrels": split if has_dev else f"test (drawn, seed {seed})"}
    if has_dev:
        ids = judged
    else:
        drawn = set(random.Random(seed).sample(judged, min(dev_queries, len(judged))))
        ids = record["query_ids"] = [q for q in judged if q in drawn]
        log.warning(
            "%s: no qrels/%s.tsv; choosing on %d test queries drawn with seed %d (listed in the "
            "policy's dev section: leave them out of test numbers)",
            data.name,
            split,
            len(ids),
            seed,
        )
    folder = Path(runs) / safe_name(data.name, "task name")
    file = next((f for f in (folder / "run.dense.trec", folder / "run.trec") if f.is_file()), None)
    if file is None:
        raise FileNotFoundError(f"{folder}/run.trec: dense run of {data.name} not found (run evaluate.py first)")
    dense = read_run(file)
    queries_to_rerank(data, dense, source=file)
    record["run"] = str(file)
    missing = [q for q in ids if q not in dense]
    if len(missing) == len(ids):
        raise ValueError(
            f"{file}: holds none of the {len(ids)} development queries of task {data.name} (qrels: {record['qrels']})"
        )
    if missing:
        record["missing_query_ids"] = missing
        log.warning(
            "%s: %d of the %d development queries of %s are not in the run; they are left out of the "
            "scores and the cost (listed under dev as missing_query_ids)",
            file,
            len(missing),
            len(ids),
            data.name,
        )
    return data, qrels, dense, [q for q in ids if q in dense], record


def policy(
    tasks: list[Path],
    runs: Path,
    out: Path,
    base: Path | None = None,
    methods: list[Literal["tourrank", "listwise"]] = ["tourrank", "listwise"],
    split: str = "dev",
    dev_queries: int = 20,
    seed: int = 13,
    metric: str = "NDCG@10",
    min_gain: float = 0.0,
    overwrite: bool = False,
) -> dict:
    """Choose each task's reranker on development queries and write the policy (the paper's π*).

    For every task, the dense run's development queries are reranked by each method and scored
    against the identity (the dense order). A reranker is chosen only when its score beats the
    identity's by more than ``min_gain``; among rerankers the best score wins, ties to fewer calls.
    The written file is ``base`` with ``tasks`` set to the choices of the tasks evaluated here, and
    only those (a ``base`` entry for another task is dropped, with a warning: it was not chosen on
    development queries), and ``dev`` holding the numbers behind them (per method: the metric, the
    prompt file, calls, tokens and seconds per query); evaluate.py reads it with ``--rerank``.

    Development queries: those judged in ``qrels/<split>.tsv`` when the task has that file; else
    ``dev_queries`` queries drawn from the gold (test) queries with ``seed``. Their ids are written
    under ``dev`` — leave them out of test numbers (the shared tasks ship no dev split). Every run
    is checked before the first call, as by ``obliq rerank run``; a run holding none of the
    development queries is refused, and development queries a run lacks are left out of the scores
    and the cost of every method, with a warning (listed under ``dev`` as ``missing_query_ids``).

    Args:
        tasks: task folders, or folders of task folders.
        runs: an evaluate.py output folder: ``<runs>/<task>/run.dense.trec`` (written when it
            reranked) or else ``<runs>/<task>/run.trec`` is the dense run.
        out: the policy file to write (YAML).
        base: a policy file whose settings (backend, depth, TourRank, listwise…) are used and kept.
        methods: the rerankers tried against the identity.
        split: the development qrels file's name (``qrels/<split>.tsv``).
        dev_queries: queries drawn when a task has no development split.
        seed: seed of that draw.
        metric: what the choice maximises (gold qrels), e.g. ``NDCG@10``.
        min_gain: how much a reranker must beat the identity by to be chosen.
        overwrite: replace an existing policy file ``out`` (refused otherwise; ``out`` may never be ``base``).

    Returns:
        The ``dev`` record: per task, the choice and the numbers.
    """
    with claim_outputs(
        {"out": out},
        command="rerank policy",
        inputs=[base, runs, *find_tasks(tasks)],
        overwrite=overwrite,
        what="a policy",
    ):
        cfg = load_policy(base) if base is not None else RerankConfig()
        parse_measures([metric])
        check_int("dev_queries", dev_queries, 1)
        methods = list(dict.fromkeys(methods))
        sets = [_development(path, Path(runs), split, dev_queries, seed) for path in find_tasks(tasks)]
        prompts = {d.name: {m: cfg.prompt(m, d.name).path for m in methods} for d, *_ in sets}  # all checked first
        reranker = Reranker(cfg)
        record: dict = {}
        for data, qrels, dense, ids, about in sets:
            scores, cost = {}, {}
            for method in ["identity", *methods]:
                reranked, stats = reranker.rerank_run(data, dense, method, ids)
                scores[method] = evaluate_run(qrels, reranked, [metric], ids).aggregate[metric]
                cost[method] = stats.as_dict()["per_query"]
            top = max(methods, key=lambda m: (scores[m], -cost[m]["calls"])) if methods else "identity"
            chosen = top if top != "identity" and scores[top] > scores["identity"] + min_gain else "identity"
            record[data.name] = {
                "chosen": chosen,
                "n_queries": len(ids),
                metric: scores,
                "cost_per_query": cost,
                "prompts": prompts[data.name],
                **about,
            }
            log.info(
                "%s: %s chosen (%s: %s)",
                data.name,
                chosen,
                metric,
                ", ".join(f"{m} {v:.4f}" for m, v in scores.items()),
            )
        dropped = {t: m for t, m in cfg.tasks.items() if t not in record}
        if dropped:
            log.warning(
                "%s: left out of %s, not evaluated on development queries here: %s",
                base,
                out,
                ", ".join(f"{t}: {m}" for t, m in dropped.items()),
            )
        cfg.tasks = {t: r["chosen"] for t, r in record.items()}
        cfg.dev = record
        dump_policy(
            cfg,
            out,
            "Reranking policy chosen by `obliq rerank policy` on development queries (the dev "
            "section).\nIt names only the tasks evaluated there; other tasks keep the dense order.\n"
            "Use it with: python evaluate.py … --rerank " + str(out),
        )
        return record
