"""obliq models and task folders inside mteb (the optional extra ``mteb``: ``pip install -e '.[mteb]'``).

Two pieces, so that mteb computes an obliq model's numbers the way ``obliq evaluate`` does:

- :class:`MtebEncoder`: any model ``obliq evaluate`` takes (an exported adapter or merged folder, an
  alias, a folder) behind mteb's encoder protocol (a subclass of ``mteb.models.abs_encoder.AbsEncoder``):
  texts are encoded by obliq's own encoder with the retrieval settings' lengths (256-token queries,
  1024-token passages, each cut to the model's capacity), and the task is passed on as in evaluation,
  so a model trained with instructions reads the OBLIQ-IR paper's B.3 instruction of an OBLIQ-Bench
  task and a merged folder its per-task prompt. A merged folder also runs in mteb as a plain
  ``SentenceTransformer`` (its per-task prompts are keyed by the mteb task names); mteb then cuts
  queries and passages at one length, the folder's ``max_seq_length``. A model that reads long texts in windows
  (its own, or ``retrieval.windows``) gives mteb the mean of a text's windows; one read by MaxSim
  (``windows.reduce maxsim``: a document is its windows' vectors) is refused, since mteb scores one vector a
  document.
- :func:`mteb_task`: an mteb retrieval task over an obliq task folder (corpus, queries, gold qrels,
  candidate sets), named by the folder's ``prompt_name`` when that is a registered mteb task (its
  metadata, with the folder as its dataset), so mteb looks up that task's prompts.

mteb scores with pytrec_eval over every judged document and ranks each query's candidates only (its
``top_ranked``), as obliq does; ``tests/test_mteb.py`` checks that mteb and ``obliq evaluate`` give the
same NDCG@10, Recall@100 and per-query values on the same folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from obliq.search.encoders import Encoder, fingerprint, load_encoder
from obliq.search.exact import unit_float32
from obliq.search.retrieval import encode_texts
from obliq.search.settings import RetrievalSettings
from obliq.tasks import load_task
from obliq.tasks.from_mteb import import_mteb
from obliq.tasks.obliq_bench import OBLIQ_BENCH

import_mteb()  # a clear error naming the extra when it is missing

from mteb.abstasks.retrieval import AbsTaskRetrieval  # noqa: E402
from mteb.models.abs_encoder import AbsEncoder  # noqa: E402
from mteb.models.model_meta import ModelMeta, ScoringFunction  # noqa: E402
from mteb.types import PromptType  # noqa: E402


@dataclass(frozen=True)
class TaskPrompt:
    """What an obliq encoder reads of the task mteb is evaluating: the names a :class:`obliq.tasks.Task`
    gives it (``prompt_name``: the mteb task name; ``instruction``: the task's query instruction)."""

    prompt_name: str
    instruction: str | None


class MtebEncoder(AbsEncoder):
    """An obliq model as an mteb encoder (see the module notes).

    Args:
        model: what ``obliq evaluate --model`` takes (not ``bm25`` or a run file), or an encoder object.
        retrieval: the lengths, batch size, encoder kind and ``trust_remote_code``, as ``evaluate``'s.
        instructions: mteb task name → query instruction (default: the OBLIQ-IR paper's B.3 prefixes
            of the OBLIQ-Bench tasks), read by an encoder trained with instructions.
        name: the model's name in mteb's results (default ``obliq/<folder name>``).

    Raises:
        as :func:`obliq.search.encoders.load_encoder`; ValueError: documents read with ``windows.reduce``
        ``maxsim`` (``retrieval.windows``, or the model's own): mteb scores one vector a document.
    """

    def __init__(
        self,
        model: str | Encoder,
        retrieval: RetrievalSettings = RetrievalSettings(),
        instructions: dict[str, str | None] | None = None,
        name: str | None = None,
    ):
        self.encoder = (
            load_encoder(model, retrieval.encoder, retrieval.trust_remote_code) if isinstance(model, str) else model
        )
        self.retrieval = retrieval
        windows = retrieval.windows or getattr(self.encoder, "windows", None)
        if windows is not None and windows.reduce == "maxsim":  # a document is its windows' vectors (MaxSim)
            whose = "retrieval.windows" if retrieval.windows is not None else f"{model}: the model's windows"
            raise ValueError(
                f"{whose}.reduce maxsim: mteb scores one vector a document, and a MaxSim document is its windows' "
                "vectors: read it in mteb with retrieval.windows.reduce mean (the mean of its windows), or score "
                "MaxSim with obliq evaluate"
            )
        self.instructions = {n: b.instruction for n, b in OBLIQ_BENCH.items()} if instructions is None else instructions
        label = Path(str(model)).name if isinstance(model, str) else type(model).__name__
        self.mteb_model_meta = ModelMeta.create_empty(
            overwrites=dict(
                name=name or f"obliq/{label}",
                revision=fingerprint(model).rsplit("@", 1)[-1] if isinstance(model, str) else "in-memory",
                similarity_fn_name=ScoringFunction.COSINE,
            )
        )

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None, **kwargs) -> np.ndarray:
        """Encode mteb's batches (their ``text``: a document's title and text, a query with its
        instruction column) as queries or passages; returns (n, d) float32 unit vectors."""
        texts = [t for batch in inputs for t in batch["text"]]
        kind = "query" if prompt_type == PromptType.query else "passage"
        length = self.retrieval.query_max_length if kind == "query" else self.retrieval.passage_max_length
        task = TaskPrompt(task_metadata.name, self.instructions.get(task_metadata.name))
        vectors = encode_texts(
            self.encoder, texts, kind, self.retrieval.batch_size, length, task, self.retrieval.windows
        )
        return unit_float32(vectors, f"{kind} embeddings")


def mteb_task(folder: str | Path, name: str | None = None):
    """An mteb retrieval task (``AbsTaskRetrieval``) over an obliq task folder's test side.

    Args:
        folder: the task folder (:func:`obliq.tasks.load_task`: corpus, queries, ``qrels/test.tsv``
            with every grade, ``top_ranked/test.jsonl`` as mteb's ``top_ranked``).
        name: the mteb task name (default: the folder's ``prompt_name``). A registered name (e.g.
            ``OBLIQBenchWritingRetrieval``) lends its metadata and subset, so mteb uses the model's
            prompts for that task; another name gets minimal metadata (mteb then drops per-task
            prompts keyed by it and uses the ``query`` / ``document`` ones).

    Returns:
        The task, with its data loaded from the folder on ``load_data``; documents are the folder's
        ``title + " " + text`` (the text obliq reads), queries their text.

    Raises:
        FileNotFoundError / ValueError: as :func:`obliq.tasks.load_task`.
    """
    import mteb
    from datasets import Dataset
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    folder = Path(folder).resolve()
    task = load_task(folder)
    name = name or task.prompt_name or f"Obliq{task.name}"
    dataset = {"path": str(folder), "revision": task.corpus_sha256[:16]}
    try:
        metadata = mteb.get_task(name).metadata.model_copy(update={"dataset": dataset, "eval_splits": ["test"]})
    except KeyError:
        metadata = TaskMetadata(
            name=name,
            description=f"obliq task folder {folder}",
            dataset=dataset,
            type="Retrieval",
            category="t2t",
            modalities=["text"],
            eval_splits=["test"],
            eval_langs=["eng-Latn"],
            main_score="ndcg_at_10",
        )
    subset = next(iter(metadata.eval_langs)) if isinstance(metadata.eval_langs, dict) else "default"

    def load_data(self, num_proc=None, **kwargs) -> None:
        if self.data_loaded:
            return
        corpus = [{"id": d, "title": "", "text": t} for d, t in zip(task.doc_ids, task.doc_texts)]
        queries = [{"id": q, "text": t} for q, t in zip(task.query_ids, task.query_texts)]
        split = RetrievalSplitData(
            corpus=Dataset.from_list(corpus),
            queries=Dataset.from_list(queries),
            relevant_docs={q: dict(judged) for q, judged in task.qrels["test"].items()},
            top_ranked=None if task.candidates is None else {q: list(c) for q, c in task.candidates.items()},
        )
        self.dataset = {subset: {"test": split}}
        self.data_loaded = True

    cls = type(f"Obliq{name}", (AbsTaskRetrieval,), {"metadata": metadata, "load_data": load_data})
    return cls()
