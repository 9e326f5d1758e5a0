"""LLM reranking with a scripted backend: TourRank's tournament, points and call count, the listwise
window, tolerant parsing with counted repairs and fallbacks, the policy file, and the policy applied
by evaluate.py and chosen by `obliq rerank policy` on real tasks."""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from obliq.cli import main as obliq_main
from obliq.commands.evaluate import evaluate
from obliq.commands.rerank import policy as policy_command
from obliq.eval.metrics import evaluate_run
from obliq.llm.backends import BackendConfig
from obliq.rerank.config import RerankConfig, TourRankConfig, load_policy
from obliq.rerank.listwise import windows
from obliq.rerank.parse import parse_permutation, parse_selection
from obliq.rerank.prompts import load_rerank_prompt, render_candidates
from obliq.rerank.reranker import Reranker
from obliq.rerank.tourrank import tourrank_calls
from obliq.search.retrieval import retrieve_bm25
from obliq.search.runs import read_run, top_k, write_run
from obliq.search.settings import RetrievalSettings
from obliq.tasks import Task, load_task

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)


class PreferenceBackend:
    """The test double of the LLM (the only one in these tests): it reads the numbered candidates of
    each prompt and answers with them ordered by ``strength(prompt, candidate text)``, strongest first
    (ties: as shown), the first ``k`` when the prompt says "Select the k". ``replies`` are used first,
    one per prompt: a string is the reply as is, an exception fails the whole ``generate`` call."""

    name = "preference"

    def __init__(self, strength, replies=()):
        self.strength, self.replies = strength, list(replies)
        self.calls = self.prompt_tokens = self.new_tokens = 0
        self.seconds, self.finished = 0.0, []
        self.shown: list[list[str]] = []
        self.texts: list[str] = []

    def generate(self, prompts, max_new_tokens, temperature, seed):
        out = []
        for messages in prompts:
            text = messages[-1]["content"]
            self.texts.append(text)
            shown = LINE.findall(text)
            self.shown.append([t for _, t in shown])
            if self.replies:
                reply = self.replies.pop(0)
                if isinstance(reply, Exception):
                    raise reply
            else:
                ranked = sorted(shown, key=lambda x: -self.strength(text, x[1]))
                k = re.search(r"Select the (\d+)", text)
                ranked = ranked[: int(k.group(1))] if k else ranked
                reply = (", " if k else " > ").join(f"[{n}]" for n, _ in ranked)
            self.calls += 1
            self.prompt_tokens += len(text.split())
            self.new_tokens += len(reply.split())
            self.seconds += 0.001
            out.append(reply)
        return out


def toy_task(n: int) -> Task:
    """``n`` documents ``d00, d01, …`` (``d000…`` past 100) whose text starts with their id; two queries."""
    ids = [f"d{i:0{2 if n <= 100 else 3}d}" for i in range(n)]
    return Task(
        name="toy",
        mechanism=None,
        path=Path("toy"),
        doc_ids=ids,
        doc_texts=[f"{d} some text" for d in ids],
        query_ids=["q1", "q2"],
        query_texts=["find the strong ones", "again"],
        qrels={"test": {"q1": {"d03": 1}, "q2": {"d01": 1}}},
        corpus_sha256="",
        report={},
    )


def dense(task: Task, queries=("q1",)) -> dict:
    """The dense run: documents in id order, d00 first."""
    return {q: {d: 1.0 - i / 1000 for i, d in enumerate(task.doc_ids)} for q in queries}


def by_id(strengths: dict[str, float]):
    return lambda prompt, line: strengths[line.split()[0]]


def ranking(run: dict, q: str = "q1") -> list[str]:
    return top_k(run[q], len(run[q]))


# --- parsing ------------------------------------------------------------------------------------------


def test_parse_repairs_duplicates_range_and_missing():
    sel = parse_selection("[4], [4], [9], [1], [2]", n=4, k=2)
    assert sel.order == [3, 0] and not sel.failed
    assert sel.repairs == {"duplicate": 1, "out_of_range": 1, "extra": 1}
    sel = parse_selection("Passage 3 is best. 3.5 stars", n=4, k=2)  # bare numbers, decimals ignored
    assert sel.order == [2, 0] and sel.repairs == {"missing": 1}
    perm = parse_permutation("[3] > [3] > [9] > [1]", n=5)
    assert perm.order == [2, 0, 1, 3, 4] and perm.repairs == {"duplicate": 1, "out_of_range": 1, "missing": 3}
    for reply in ("", None, "I cannot rank these.", "[0] > [7]"):
        assert parse_permutation(reply, 3).failed and parse_permutation(reply, 3).order == [0, 1, 2]
        assert parse_selection(reply, 3, 2).failed and parse_selection(reply, 3, 2).order == [0, 1]


# --- TourRank -----------------------------------------------------------------------------------------


def test_tourrank_with_known_preferences_gives_the_expected_ranking():
    # 12 documents, depth 8, stages 8 -> 4 -> 2 -> 1, groups of at most 4, one tournament; the model
    # prefers higher ids. Snake seeding deals {d00,d03,d04,d07} and {d01,d02,d05,d06}; they send
    # d07,d04 and d06,d05 on; then d07,d06; then d07. Points 3,2,1,1; ties in dense order; d08-d11
    # (never shown) keep their dense order after the reranked eight.
    task = toy_task(12)
    backend = PreferenceBackend(by_id({d: i for i, d in enumerate(task.doc_ids)}))
    cfg = RerankConfig(depth=8, tourrank=TourRankConfig(stages=[4, 2, 1], group_size=4, tournaments=1))
    run, stats = Reranker(cfg, backend).rerank_run(task, dense(task), "tourrank")
    assert ranking(run) == ["d07", "d06", "d04", "d05", "d00", "d01", "d02", "d03", "d08", "d09", "d10", "d11"]
    assert [sorted(s) for s in backend.shown[:2]] == [
        ["d00 some text", "d03 some text", "d04 some text", "d07 some text"],
        ["d01 some text", "d02 some text", "d05 some text", "d06 some text"],
    ]
    assert stats.calls == backend.calls == 4 == tourrank_calls(8, cfg.tourrank)
    assert stats.queries == 1 and stats.failed_calls == 0 and sum(stats.repairs.values()) == 0
    assert stats.prompt_tokens == backend.prompt_tokens and stats.new_tokens == backend.new_tokens


def test_tourrank_points_over_tournaments_follow_the_preference():
    # top-20 in single groups (g = 20): whatever the grouping, the two strongest win 3 points per
    # tournament, the next three 2, the next five 1; ties keep the dense order.
    task = toy_task(25)
    rng = random.Random(7)
    strength = {d: rng.random() for d in task.doc_ids}
    backend = PreferenceBackend(by_id(strength))
    cfg = RerankConfig(depth=20, tourrank=TourRankConfig(tournaments=3))
    run, stats = Reranker(cfg, backend).rerank_run(task, dense(task), "tourrank")
    head = task.doc_ids[:20]
    pref = sorted(head, key=lambda d: -strength[d])
    points = {d: 3 if r < 2 else 2 if r < 5 else 1 if r < 10 else 0 for r, d in enumerate(pref)}
    assert ranking(run) == sorted(head, key=lambda d: (-points[d], head.index(d))) + task.doc_ids[20:]
    assert stats.calls == 3 * (1 + 1 + 1) == tourrank_calls(20, cfg.tourrank)
    first_stage = backend.shown[:3]  # the three tournaments' first groups: same documents, other orders
    assert first_stage[0] == [f"{d} some text" for d in head]
    assert all(sorted(s) == sorted(first_stage[0]) for s in first_stage) and first_stage[1] != first_stage[0]


@pytest.mark.parametrize(
    "n, stages, g, y, expected",
    [
        (100, [50, 20, 10, 5, 2], 20, 5, 5 * (5 + 3 + 1 + 1 + 1)),  # the paper's 100 -> 50 -> 20 -> 10 -> 5 -> 2, Y = 5
        (100, [50, 20, 10, 5, 2], 10, 5, 5 * (10 + 5 + 2 + 1 + 1)),
        (20, [50, 20, 10, 5, 2], 20, 5, 5 * (1 + 1 + 1)),  # a top-20 skips the stages it cannot fill
        (37, [20, 9, 3], 8, 2, 2 * (5 + 3 + 2)),
    ],
)
def test_tourrank_call_count_matches_the_formula(n, stages, g, y, expected):
    task = toy_task(n + 3)
    strength = {d: random.Random(d).random() for d in task.doc_ids}
    backend = PreferenceBackend(by_id(strength))
    cfg = RerankConfig(depth=n, tourrank=TourRankConfig(stages=stages, group_size=g, tournaments=y))
    run, stats = Reranker(cfg, backend).rerank_run(task, dense(task, ["q1", "q2"]), "tourrank")
    assert backend.calls == stats.calls == 2 * expected and tourrank_calls(n, cfg.tourrank) == expected
    assert stats.per_query()["calls"] == expected
    for q in ("q1", "q2"):
        order = ranking(run, q)
        assert sorted(order) == task.doc_ids and order[n:] == task.doc_ids[n:]  # each document exactly once
        # the strongest wins every group it is in, so it is among the last stage's winners (equal points)
        assert max(task.doc_ids[:n], key=strength.get) in order[: stages[-1]]


def test_every_document_once_whatever_the_model_writes():
    task = toy_task(130)
    rng = random.Random(3)
    words = ["[", "]", ",", ">", "passage", "1.5", "-2", "[0]", "[101]", "I", "think"]
    junk = [
        " ".join(rng.choice(words + [f"[{rng.randint(0, 25)}]", str(rng.randint(0, 25))]) for _ in range(12))
        for _ in range(400)
    ]
    backend = PreferenceBackend(by_id({d: 0 for d in task.doc_ids}), replies=junk)
    reranker = Reranker(RerankConfig(), backend)
    for method in ("tourrank", "listwise"):
        run, stats = reranker.rerank_run(task, dense(task, ["q1", "q2"]), method)
        for q in ("q1", "q2"):
            order = ranking(run, q)
            assert sorted(order) == task.doc_ids and order[100:] == task.doc_ids[100:]
        assert stats.calls == 2 * (55 if method == "tourrank" else 9) and sum(stats.repairs.values()) > 0


def test_malformed_selections_are_repaired_and_counted_and_failures_fall_back():
    task = toy_task(4)
    cfg = RerankConfig(depth=4, tourrank=TourRankConfig(stages=[2], group_size=4, tournaments=1))
    replies = ["[4], [4], [1], [2]", "[7]", "[3]", RuntimeError("CUDA out of memory")]
    backend = PreferenceBackend(by_id({d: 0 for d in task.doc_ids}), replies=replies)
    out = []
    for _ in replies:
        run, stats = Reranker(cfg, backend).rerank_run(task, dense(task), "tourrank")
        out.append((ranking(run), stats))
    assert [o for o, _ in out] == [
        ["d00", "d03", "d01", "d02"],  # duplicate and extra dropped; a point each
        ["d00", "d01", "d02", "d03"],  # nothing usable: input order
        ["d00", "d02", "d01", "d03"],  # one missing: filled in input order
        ["d00", "d01", "d02", "d03"],
    ]  # the backend raised: input order
    assert [(s.calls, s.failed_calls, s.repaired_calls) for _, s in out] == [(1, 0, 1), (1, 1, 1), (1, 0, 1), (1, 1, 0)]
    assert [dict(s.repairs) for _, s in out] == [
        {"out_of_range": 0, "duplicate": 1, "extra": 1, "missing": 0},
        {"out_of_range": 1, "duplicate": 0, "extra": 0, "missing": 0},
        {"out_of_range": 0, "duplicate": 0, "extra": 0, "missing": 1},
        {"out_of_range": 0, "duplicate": 0, "extra": 0, "missing": 0},
    ]


# --- listwise -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, window, step, calls",
    [
        (100, 20, 10, 9),
        (25, 20, 10, 2),
        (20, 20, 10, 1),
        (7, 20, 5, 1),
        (100, 100, 50, 1),
        (50, 10, 10, 5),
        (2, 20, 10, 1),
    ],
)
def test_listwise_windows(n, window, step, calls):
    spans = windows(n, window, step)
    assert len(spans) == calls and spans[-1][0] == 0 and spans[0][1] == n
    assert all(b - a == min(window, n) for a, b in spans)


def test_nothing_to_order_makes_no_call_and_loads_no_model(monkeypatch):
    # depth 1, or a query with one candidate: no window, no group, no model loaded
    assert windows(1, 20, 10) == [] and windows(0, 20, 10) == []
    monkeypatch.setattr(BackendConfig, "build", lambda self: pytest.fail("the model was loaded"))
    task = toy_task(5)
    run = {"q1": {"d03": 1.0}, "q2": {d: 1.0 - i / 10 for i, d in enumerate(task.doc_ids)}}
    for method in ("listwise", "tourrank"):
        for depth, queries in ((1, ["q1", "q2"]), (20, ["q1"])):
            out, stats = Reranker(RerankConfig(depth=depth)).rerank_run(task, run, method, queries)
            assert {q: ranking(out, q) for q in queries} == {q: ranking(run, q) for q in queries}
            assert (stats.calls, stats.queries, stats.per_query()["calls"]) == (0, len(queries), 0.0)
    # a document the corpus lacks fails before any model is loaded, whatever its query's position
    bad = {**run, "q2": {**run["q2"], "x99": 0.0}}
    with pytest.raises(ValueError, match=r"the run: document 'x99' of query 'q2' is not in the corpus of task toy"):
        Reranker(RerankConfig(depth=2)).rerank_run(task, bad, "listwise")


def test_listwise_brings_the_strongest_ten_to_the_top_and_repairs_permutations():
    task = toy_task(100)
    strength = {d: random.Random(d + "x").random() for d in task.doc_ids}
    backend = PreferenceBackend(by_id(strength))
    run, stats = Reranker(RerankConfig(), backend).rerank_run(task, dense(task), "listwise")
    assert ranking(run)[:10] == sorted(task.doc_ids, key=lambda d: -strength[d])[:10]  # window 20, step 10
    assert stats.calls == 9 and stats.failed_calls == 0

    task = toy_task(5)
    replies = ["[3] > [3] > [9] > [1]", "Ranking: 2, 5, 4, 1, 3", "I cannot rank these passages.", ValueError("bad")]
    backend = PreferenceBackend(by_id({d: 0 for d in task.doc_ids}), replies=replies)
    reranker = Reranker(RerankConfig(), backend)
    orders, total = [], defaultdict(int)
    for _ in replies:
        run, stats = reranker.rerank_run(task, dense(task), "listwise")
        orders.append(ranking(run))
        for key in ("calls", "failed_calls", "repaired_calls"):
            total[key] += getattr(stats, key)
        for kind, n in stats.repairs.items():
            total[kind] += n
    assert orders == [
        ["d02", "d00", "d01", "d03", "d04"],
        ["d01", "d04", "d03", "d00", "d02"],
        task.doc_ids,
        task.doc_ids,
    ]
    assert dict(total) == {
        "calls": 4,
        "failed_calls": 2,
        "repaired_calls": 1,
        "out_of_range": 1,
        "duplicate": 1,
        "extra": 0,
        "missing": 3,
    }


# --- prompts and the policy file ----------------------------------------------------------------------


def test_prompt_dir_wins_over_every_packaged_prompt(tmp_path, caplog):
    default = "method: listwise\nuser: 'Mine: {query} {documents}'\n"
    (tmp_path / "listwise_default.yaml").write_text(default)
    cfg = RerankConfig(prompt_dir=str(tmp_path))
    with caplog.at_level("INFO", logger="obliq.rerank.config"):
        # a packaged listwise_math-theoremqa.yaml exists, yet the user's default comes first
        assert cfg.prompt("listwise", "math-theoremqa").path == str(tmp_path / "listwise_default.yaml")
        assert cfg.prompt("tourrank", "math-theoremqa").path == "obliq/rerank/prompts/tourrank.yaml"
    assert f"math-theoremqa: listwise prompt {tmp_path / 'listwise_default.yaml'}" in caplog.text
    assert "math-theoremqa: tourrank prompt obliq/rerank/prompts/tourrank.yaml" in caplog.text
    (tmp_path / "listwise_math-theoremqa.yaml").write_text(default)
    assert load_rerank_prompt("listwise", "math-theoremqa", tmp_path).path == str(
        tmp_path / "listwise_math-theoremqa.yaml"
    )
    assert load_rerank_prompt("listwise", "math-theoremqa").path == "obliq/rerank/prompts/listwise_math-theoremqa.yaml"


def test_prompts_load_and_name_the_latent_attribute(tmp_path, caplog):
    tour = load_rerank_prompt("tourrank")
    messages = render_candidates(tour, "which tweets oppose it", ["a b c", "one two three four"], k=1, max_doc_words=3)
    assert (
        "[1] a b c\n[2] one two three …" in messages[-1]["content"]
        and "Select the 1 passages" in messages[-1]["content"]
    )
    writing = render_candidates(load_rerank_prompt("listwise", "writing-news"), "q", ["x", "y"])[-1]["content"]
    assert "authorial style" in writing and "Ignore topic" in writing and "[2] y" in writing
    for task in ("math-theoremqa", "stance-tweets", "hearings-exchanges"):
        assert load_rerank_prompt("listwise", task).header["task"] == task
    with caplog.at_level("WARNING"):
        assert load_rerank_prompt("listwise", "health-dialect").path.endswith("listwise_default.yaml")
    assert "not task-aware" in caplog.text
    (tmp_path / "listwise_toy.yaml").write_text("method: listwise\nuser: '{query} {documents} {author}'\n")
    with pytest.raises(ValueError, match=r"listwise_toy.yaml: unknown field\(s\) \['author'\]"):
        load_rerank_prompt("listwise", "toy", tmp_path)


def test_every_rerank_config_loads():
    files = sorted((REPO / "configs" / "rerank").glob("*.yaml"))
    assert {f.name for f in files} >= {"cpu-smollm2.yaml", "paper.yaml"}
    for f in files:
        cfg = load_policy(f)
        assert cfg.tasks["writing-news"] == "identity" and cfg.method("math-theoremqa") == "tourrank"
        assert cfg.method("health-dialect") == "identity"
    paper = load_policy(REPO / "configs" / "rerank" / "paper.yaml")
    assert paper.depth == 100 and tourrank_calls(100, paper.tourrank) == 55 and len(windows(100, 100, 50)) == 1


@pytest.mark.parametrize(
    "text, message",
    [
        ("depth: 20\ntourrank:\n  stages: [10, 10, 2]\n", r"bad.yaml:3:tourrank.stages: must be strictly decreasing"),
        ("tourrank:\n  rounds: 3\n", r"bad.yaml:2:tourrank.rounds: unknown key"),
        (
            "tasks:\n  writing-news: rerank\n",
            r"bad.yaml:2:tasks.writing-news: must be one of identity, tourrank, listwise",
        ),
        ("depth: 0\n", r"bad.yaml:1:depth: must be an integer >= 1"),
        ("backend:\n  name: ollama\n", r"bad.yaml:2:backend.name: must be one of llamacpp, transformers, vllm"),
        ("listwise: 5\n", r"bad.yaml:1:listwise: expected a mapping"),
        (
            "depth: 5\nbackend:\n  dtype: float33\n",
            r"bad.yaml:3:backend.dtype: must be one of float32, bfloat16, float16, "
            r"got 'float33'",
        ),
        (
            "backend:\n  device: gpu\n",
            r"bad.yaml:2:backend.device: must be a torch device \(cpu, cuda, cuda:1, …\), got 'gpu'",
        ),
        ("backend:\n  device: 0\n", r"bad.yaml:2:backend.device: must be a torch device"),
        (
            "backend:\n  model: smolm2\n",
            r"bad.yaml:2:backend.model: model .smolm2. is not an alias .*did you mean .smollm2.",
        ),
        (
            "backend:\n  model: ./no-such-model\n",
            r"bad.yaml:2:backend.model: model .*/no-such-model': no such file or folder",
        ),
        (
            "backend:\n  name: vllm\n  gpu_memory_utilization: true\n",
            r"bad.yaml:3:backend.gpu_memory_utilization: must be a number in",
        ),
        ("backend:\n  threads: 0\n", r"bad.yaml:2:backend.threads: must be an integer >= 1"),
        (
            "backend:\n  name: vllm\n  max_model_len: 1.5\n",
            r"bad.yaml:3:backend.max_model_len: must be an integer >= 1",
        ),
        (
            "backend:\n  name: llamacpp\n  device: cpu\n",
            r"bad.yaml:3:backend.device: a transformers setting; the llamacpp backend takes name, model",
        ),
        ("backend:\n  rounds: 3\n", r"bad.yaml:2:backend.rounds: unknown key; the transformers backend takes name"),
        ("prompt_dir: ../no-such-prompts\n", r"bad.yaml:1:prompt_dir: not a folder: /.*/no-such-prompts$"),
    ],
)
def test_policy_errors_name_file_line_and_key(tmp_path, text, message):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_policy(tmp_path / "bad.yaml")


def test_cli_reports_a_bad_policy_in_one_line(tmp_path, tasks_dir, capsys):
    (tmp_path / "bad.yaml").write_text("depth: 20\ntourrank:\n  group_size: 1\n")
    with pytest.raises(SystemExit) as exit_:
        obliq_main(
            [
                "rerank",
                "run",
                str(tasks_dir / "math-theoremqa"),
                str(tmp_path / "run.trec"),
                str(tmp_path / "out.trec"),
                "--policy",
                str(tmp_path / "bad.yaml"),
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert err[0] == f"error: {tmp_path / 'bad.yaml'}:3:tourrank.group_size: must be an integer >= 2, got 1"


# --- real tasks: evaluate.py --rerank, obliq rerank run / policy --------------------------------------


class Oracle:
    """Strength = the candidate's relevance grade for the prompt's query (× ``sign``); None when the
    prompt holds none of the task's queries. Needs uncut queries and documents in prompts."""

    def __init__(self, task: Task, sign: float = 1.0):
        self.queries = [(t, q) for q, t in zip(task.query_ids, task.query_texts)]
        self.docs = defaultdict(list)
        for d, t in zip(task.doc_ids, task.doc_texts):
            self.docs[" ".join(t.split())].append(d)
        self.qrels, self.sign = task.qrels["test"], sign

    def __call__(self, prompt: str, line: str) -> float | None:
        qid = next((q for t, q in self.queries if t in prompt), None)
        if qid is None:
            return None
        return self.sign * max(self.qrels.get(qid, {}).get(d, 0) for d in self.docs[line])


def first(*oracles):
    return lambda prompt, line: next(s for s in (o(prompt, line) for o in oracles) if s is not None)


UNCUT = {"max_query_words": 1000, "max_doc_words": 1000}


@pytest.fixture(scope="module")
def real(tasks_dir):
    return {name: load_task(tasks_dir / name) for name in ("math-theoremqa", "stance-tweets")}


def test_evaluate_reranks_only_the_tasks_the_policy_names(tmp_path, tasks_dir, real, monkeypatch):
    backend = PreferenceBackend(first(Oracle(real["stance-tweets"]), Oracle(real["math-theoremqa"])))
    monkeypatch.setattr(BackendConfig, "build", lambda self: backend)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump({"tasks": {"stance-tweets": "listwise", "writing-news": "tourrank"}, "depth": 100, **UNCUT})
    )
    tasks = [str(tasks_dir / "math-theoremqa"), str(tasks_dir / "stance-tweets")]
    panel = ["NDCG@10", "NDCG@50", "Recall@10", "Recall@50", "Recall@100"]  # at most the depth of a top-100
    plain = evaluate("bm25", tasks, tmp_path / "plain", RetrievalSettings(top_k=100), panel, latency_queries=0)
    summaries = obliq_main(
        [
            "evaluate",
            "--model",
            "bm25",
            "--tasks",
            *tasks,
            "--output",
            str(tmp_path / "out"),
            "--retrieval.top_k",
            "100",
            "--measures",
            json.dumps(panel),
            "--latency_queries",
            "0",
            "--rerank",
            str(policy),
        ]
    )
    math, stance = summaries
    # math-theoremqa is not named: the dense run, untouched and not charged
    assert math["rerank"] == {"method": "identity"} and math["metrics"] == plain[0]["metrics"]
    assert read_run(tmp_path / "out" / "math-theoremqa" / "run.trec") == read_run(
        tmp_path / "plain" / "math-theoremqa" / "run.trec"
    )
    assert not (tmp_path / "out" / "math-theoremqa" / "run.dense.trec").exists()
    # stance-tweets: its top-100 reranked by the (oracle) listwise reranker, 9 windows per query
    r = stance["rerank"]
    assert r["method"] == "listwise" and r["depth"] == 100 and r["backend"] == "transformers:smollm2"
    assert r["prompt"] == "obliq/rerank/prompts/listwise_stance-tweets.yaml"
    assert r["dense_metrics"] == plain[1]["metrics"]
    assert r["cost"]["calls"] == backend.calls == 10 * 9 and r["cost"]["per_query"]["calls"] == 9
    assert r["cost"]["failed_calls"] == 0 and r["cost"]["prompt_tokens"] == backend.prompt_tokens > 0
    dense_run = read_run(tmp_path / "out" / "stance-tweets" / "run.dense.trec")
    qrels = real["stance-tweets"].qrels["test"]
    ideal = {
        q: {d: 1000.0 - i + 1000 * qrels[q].get(d, 0) for i, d in enumerate(top_k(docs, 100))}
        for q, docs in dense_run.items()
    }  # the best order of the same top-100
    best = evaluate_run(qrels, ideal, ["NDCG@10", "Recall@100"])
    assert stance["metrics"]["NDCG@10"] == pytest.approx(best.aggregate["NDCG@10"])
    assert best.aggregate["NDCG@10"] > r["dense_metrics"]["NDCG@10"] + 0.3
    assert stance["metrics"]["Recall@100"] == pytest.approx(r["dense_metrics"]["Recall@100"])  # same top-100
    report = (tmp_path / "out" / "results.md").read_text()
    assert "cost per reranked query, and failed and repaired calls out of all calls" in report
    assert (
        "| queries | reasoning | calls / query | tokens in / query | tokens out / query | seconds / query | "
        "failed / all calls | repaired / all calls |" in report
    )
    row = next(line for line in report.splitlines() if line.startswith("| stance-tweets | listwise | 100 |"))
    assert row.endswith(
        f"| 10 | off | 9.0 | {backend.prompt_tokens / 10:.0f} | {backend.new_tokens / 10:.0f} | "
        f"{r['cost']['per_query']['seconds']:.2f} | 0 / 90 | 0 / 90 |"
    )
    assert "math-theoremqa | listwise" not in report
    assert load_policy(tmp_path / "out" / "rerank_policy.yaml").tasks == {
        "stance-tweets": "listwise",
        "writing-news": "tourrank",
    }


def test_rerank_commands_run_and_choose_the_policy(tmp_path, tasks_dir, real, monkeypatch, capsys):
    # the model helps on math (it knows the qrels) and hurts on stance (it prefers the non-relevant)
    backend = PreferenceBackend(first(Oracle(real["math-theoremqa"]), Oracle(real["stance-tweets"], -1)))
    monkeypatch.setattr(BackendConfig, "build", lambda self: backend)
    evaluate(
        "bm25",
        [str(tasks_dir / "math-theoremqa"), str(tasks_dir / "stance-tweets")],
        tmp_path / "bm25",
        RetrievalSettings(top_k=100),
        ["NDCG@10", "Recall@100"],
        latency_queries=0,
    )
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"depth": 20, "tourrank": {"tournaments": 1}, **UNCUT}))

    obliq_main(
        [
            "rerank",
            "run",
            str(tasks_dir / "math-theoremqa"),
            str(tmp_path / "bm25" / "math-theoremqa" / "run.trec"),
            str(tmp_path / "math.trec"),
            "--policy",
            str(base),
            "--method",
            "tourrank",
            "--queries",
            "4",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["n_queries"] == 4 and report["cost"]["calls"] == 4 * 3 and report["cost"]["per_query"]["calls"] == 3
    assert report["prompt"] == "obliq/rerank/prompts/tourrank.yaml"
    assert report["metrics"]["tourrank"]["NDCG@10"] >= report["metrics"]["dense"]["NDCG@10"]
    assert len(read_run(tmp_path / "math.trec")) == 4
    assert json.loads((tmp_path / "math.trec.report.json").read_text())["cost"] == report["cost"]

    out = tmp_path / "policy.yaml"
    obliq_main(
        [
            "rerank",
            "policy",
            "--tasks",
            json.dumps([str(tasks_dir / "math-theoremqa"), str(tasks_dir / "stance-tweets")]),
            "--runs",
            str(tmp_path / "bm25"),
            "--out",
            str(out),
            "--base",
            str(base),
            "--dev_queries",
            "5",
        ]
    )
    dev = json.loads(capsys.readouterr().out)
    chosen = load_policy(out)
    math, stance = dev["math-theoremqa"], dev["stance-tweets"]
    assert chosen.tasks == {"math-theoremqa": math["chosen"], "stance-tweets": "identity"} and chosen.dev == dev
    assert math["chosen"] in ("tourrank", "listwise")
    assert math["NDCG@10"][math["chosen"]] > math["NDCG@10"]["identity"]
    assert max(stance["NDCG@10"]["tourrank"], stance["NDCG@10"]["listwise"]) < stance["NDCG@10"]["identity"]
    assert math["n_queries"] == stance["n_queries"] == 5 and len(math["query_ids"]) == 5
    assert math["cost_per_query"]["tourrank"]["calls"] == 3 and math["cost_per_query"]["listwise"]["calls"] == 1
    assert math["cost_per_query"]["identity"]["calls"] == 0
    assert math["prompts"] == {
        "tourrank": "obliq/rerank/prompts/tourrank.yaml",
        "listwise": "obliq/rerank/prompts/listwise_math-theoremqa.yaml",
    }
    assert chosen.depth == 20 and chosen.tourrank.tournaments == 1  # the base settings are kept
    assert out.read_text().startswith("# Reranking policy chosen by `obliq rerank policy`")


# --- bad input to the commands: one line, the right file, before any call ---------------------------


@pytest.fixture(scope="module")
def bm25_runs(real):
    return {name: retrieve_bm25(task, RetrievalSettings(top_k=100)).run for name, task in real.items()}


def no_model(monkeypatch):
    monkeypatch.setattr(BackendConfig, "build", lambda self: pytest.fail("a model was loaded"))


def one_line_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        obliq_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    return err[0]


def test_policy_refuses_a_run_of_another_task_or_an_empty_one(
    tmp_path, tasks_dir, real, bm25_runs, monkeypatch, capsys
):
    no_model(monkeypatch)
    out, file = tmp_path / "policy.yaml", tmp_path / "runs" / "stance-tweets" / "run.trec"
    argv = [
        "rerank",
        "policy",
        "--tasks",
        json.dumps([str(tasks_dir / "stance-tweets")]),
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(out),
    ]
    stance = real["stance-tweets"].query_ids[0]
    math = bm25_runs["math-theoremqa"]
    for run, seen in ((math, f"its ids look like {next(iter(math))!r}"), ({}, "it is empty")):
        write_run(file, run)
        assert one_line_error(capsys, argv) == (
            f"error: {file}: no query of task stance-tweets ({seen}; the task's like {stance!r})"
        )
        assert not out.exists()
    # `obliq rerank run` makes the same check (one function: queries_to_rerank)
    write_run(file, {})
    assert one_line_error(
        capsys,
        [
            "rerank",
            "run",
            str(tasks_dir / "stance-tweets"),
            str(file),
            str(tmp_path / "o.trec"),
            "--method",
            "listwise",
        ],
    ).startswith(f"error: {file}: no query of task stance-tweets")
    # a run of the task's queries whose documents are another task's
    write_run(file, {q: bm25_runs["math-theoremqa"][m] for q, m in zip(real["stance-tweets"].query_ids, math)})
    assert one_line_error(capsys, argv).startswith(f"error: {file}: document ")
    # a run holding queries of the task but none of its development queries (qrels/dev.tsv)
    task = tmp_path / "tasks" / "stance-tweets"
    (task / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl", "task.json", "qrels/test.tsv"):
        (task / name).symlink_to(tasks_dir / "stance-tweets" / name)
    dev = real["stance-tweets"].query_ids[:2]
    rows = [
        line
        for line in (tasks_dir / "stance-tweets" / "qrels" / "test.tsv").read_text().splitlines()[1:]
        if line.split("\t")[0] in dev
    ]
    (task / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    write_run(file, {q: r for q, r in bm25_runs["stance-tweets"].items() if q not in dev})
    argv[argv.index("--tasks") + 1] = json.dumps([str(task)])
    assert one_line_error(capsys, argv) == (
        f"error: {file}: holds none of the 2 development queries of task stance-tweets (qrels: dev)"
    )
    assert not out.exists()


def test_policy_leaves_out_dev_queries_the_run_lacks_and_drops_base_tasks(
    tmp_path, tasks_dir, real, bm25_runs, monkeypatch, caplog
):
    backend = PreferenceBackend(first(Oracle(real["stance-tweets"])))
    monkeypatch.setattr(BackendConfig, "build", lambda self: backend)
    base = tmp_path / "base.yaml"
    base.write_text(
        yaml.safe_dump(
            {
                "tasks": {"math-theoremqa": "tourrank", "stance-tweets": "identity"},
                "depth": 20,
                "tourrank": {"tournaments": 1},
                **UNCUT,
            }
        )
    )
    task = real["stance-tweets"]
    judged = [q for q in task.query_ids if any(g > 0 for g in task.qrels["test"].get(q, {}).values())]
    lacking = judged[0]
    write_run(
        tmp_path / "runs" / "stance-tweets" / "run.trec",
        {q: d for q, d in bm25_runs["stance-tweets"].items() if q != lacking},
    )
    out = tmp_path / "policy.yaml"
    with caplog.at_level("WARNING"):
        dev = policy_command([tasks_dir / "stance-tweets"], tmp_path / "runs", out, base=base, dev_queries=len(judged))
    used = judged[1:]
    record = dev["stance-tweets"]
    assert (
        record["query_ids"] == judged and record["missing_query_ids"] == [lacking] and record["n_queries"] == len(used)
    )
    # scored and charged on the queries the run holds: no zero for the missing one, no diluted cost
    assert record["cost_per_query"]["tourrank"]["calls"] == 3 and record["cost_per_query"]["listwise"]["calls"] == 1
    assert backend.calls == len(used) * (3 + 1)
    dense_run = {q: bm25_runs["stance-tweets"][q] for q in used}
    assert record["NDCG@10"]["identity"] == pytest.approx(
        evaluate_run(task.qrels["test"], dense_run, ["NDCG@10"], used).aggregate["NDCG@10"]
    )
    assert f"1 of the {len(judged)} development queries of stance-tweets are not in the run" in caplog.text
    # only the evaluated task is written; the base's math-theoremqa entry is dropped, and said so
    written = load_policy(out)
    assert written.tasks == {"stance-tweets": record["chosen"]} and record["chosen"] in ("tourrank", "listwise")
    assert f"left out of {out}, not evaluated on development queries here: math-theoremqa: tourrank" in caplog.text
    assert "It names only the tasks evaluated there" in out.read_text()


def test_a_bad_prompt_fails_when_the_policy_is_loaded_and_names_the_prompt_file(
    tmp_path, tasks_dir, monkeypatch, capsys
):
    no_model(monkeypatch)
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "tourrank.yaml").write_text("method: tourrank\nuser: 'pick {k} of {documents}'\n")
    (prompts / "listwise_default.yaml").write_text("method: listwise\nuser: '{documents}'\n")
    bad = {
        "tourrank": f"{prompts / 'tourrank.yaml'}: user: must contain {{query}}",
        "listwise": f"{prompts / 'listwise_default.yaml'}: user: must contain {{query}}",
    }
    policy = tmp_path / "policy.yaml"
    policy.write_text("tasks:\n  math-theoremqa: tourrank\nprompt_dir: prompts\n")
    with pytest.raises(ValueError) as err:
        load_policy(policy)
    assert str(err.value) == bad["tourrank"]
    # evaluate.py: before any retrieval
    monkeypatch.setattr("obliq.search.retrieval.retrieve_bm25", lambda *a, **k: pytest.fail("retrieval ran"))
    with pytest.raises(ValueError) as err:
        evaluate("bm25", [str(tasks_dir / "math-theoremqa")], tmp_path / "out", rerank=policy)
    assert str(err.value) == bad["tourrank"]
    # obliq rerank run: the prompt file named, not the run (which is not even read: it does not exist)
    run = ["rerank", "run", str(tasks_dir / "math-theoremqa"), str(tmp_path / "missing.trec"), str(tmp_path / "o.trec")]
    assert one_line_error(capsys, run + ["--policy", str(policy)]) == f"error: {bad['tourrank']}"
    # a method given on the command line: its prompt for the task is checked first too
    policy.write_text("prompt_dir: prompts\n")
    assert (
        one_line_error(capsys, run + ["--policy", str(policy), "--method", "listwise"]) == f"error: {bad['listwise']}"
    )
    # obliq rerank policy: every method's prompt of every task, before any run is reranked
    runs = tmp_path / "runs"
    for name in ("math-theoremqa", "stance-tweets"):
        task = load_task(tasks_dir / name)
        write_run(runs / name / "run.trec", {q: {task.doc_ids[0]: 1.0} for q in task.query_ids})
    (prompts / "tourrank.yaml").write_text("method: tourrank\nuser: '{query}: pick {k} of {documents}'\n")
    argv = [
        "rerank",
        "policy",
        "--tasks",
        json.dumps([str(tasks_dir / "math-theoremqa"), str(tasks_dir / "stance-tweets")]),
        "--runs",
        str(runs),
        "--out",
        str(tmp_path / "chosen.yaml"),
        "--base",
        str(policy),
    ]
    assert one_line_error(capsys, argv) == f"error: {bad['listwise']}"


def test_rerank_run_refuses_a_task_the_policy_does_not_name(tmp_path, tasks_dir, real, bm25_runs, monkeypatch, capsys):
    no_model(monkeypatch)
    write_run(tmp_path / "run.trec", bm25_runs["stance-tweets"])
    policy = tmp_path / "policy.yaml"
    policy.write_text("tasks:\n  math-theoremqa: tourrank\n")
    run = ["rerank", "run", str(tasks_dir / "stance-tweets"), str(tmp_path / "run.trec"), str(tmp_path / "o.trec")]
    fix = "pass --method tourrank, listwise or identity"
    assert (
        one_line_error(capsys, run + ["--policy", str(policy)])
        == f"error: {policy}: tasks: no entry for task stance-tweets; {fix}"
    )
    assert (
        one_line_error(capsys, run)
        == f"error: the built-in policy (no --policy): tasks: no entry for task stance-tweets; {fix}"
    )
    assert not (tmp_path / "o.trec").exists()
    obliq_main(run + ["--policy", str(policy), "--method", "identity", "--queries", "3"])
    report = json.loads(capsys.readouterr().out)
    assert report["method"] == "identity" and report["prompt"] is None and report["cost"]["calls"] == 0
    assert read_run(tmp_path / "o.trec") == {
        q: bm25_runs["stance-tweets"][q] for q in real["stance-tweets"].query_ids[:3]
    }


def test_relative_paths_in_a_policy_are_resolved_against_its_folder(tmp_path, tasks_dir, monkeypatch, real):
    (tmp_path / "configs").mkdir()
    (tmp_path / "prompts" / "x").mkdir(parents=True)
    (tmp_path / "prompts" / "x" / "listwise_default.yaml").write_text(
        "method: listwise\nuser: 'Q {query} D {documents}'\n"
    )
    (tmp_path / "configs" / "my-model").mkdir()
    policy = tmp_path / "configs" / "policy.yaml"
    policy.write_text(
        "tasks:\n  stance-tweets: listwise\nprompt_dir: ../prompts/x\nbackend:\n  model: my-model\n"
        "depth: 100\nmax_query_words: 1000\nmax_doc_words: 1000\n"
    )
    elsewhere = tmp_path / "elsewhere" / "deeper"  # where ../prompts/x is no folder
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    cfg = load_policy(Path("../..") / "configs" / "policy.yaml")
    assert cfg.prompt_dir == str(tmp_path / "prompts" / "x") and cfg.backend.model == str(
        tmp_path / "configs" / "my-model"
    )
    assert cfg.prompt("listwise", "stance-tweets").path == str(tmp_path / "prompts" / "x" / "listwise_default.yaml")
    # evaluate.py writes the policy as loaded: its copy still finds the prompts from its own folder
    backend = PreferenceBackend(first(Oracle(real["stance-tweets"])))
    monkeypatch.setattr(BackendConfig, "build", lambda self: backend)
    (summary,) = evaluate(
        "bm25",
        [str(tasks_dir / "stance-tweets")],
        tmp_path / "out",
        RetrievalSettings(top_k=100),
        ["NDCG@10", "Recall@100"],
        latency_queries=0,
        rerank=Path("../..") / "configs" / "policy.yaml",
    )
    assert summary["rerank"]["prompt"] == str(tmp_path / "prompts" / "x" / "listwise_default.yaml")
    assert backend.calls == 10 * 9 and all(text.startswith("Q ") for text in backend.texts)
    copy = load_policy(tmp_path / "out" / "rerank_policy.yaml")
    assert copy.prompt_dir == cfg.prompt_dir and copy.tasks == cfg.tasks and copy.backend == cfg.backend
