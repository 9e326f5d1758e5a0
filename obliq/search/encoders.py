"""What evaluation encodes with: a small protocol, its sentence-transformers implementation, a loader.

Anything with ``encode(texts, kind, batch_size)`` returning (n, d) vectors can be evaluated:
obliq's own :class:`obliq.model.BiEncoder` (``query: `` / ``passage: `` prefixes, mean pooling) and
:class:`SentenceTransformerEncoder` for plain sentence-transformers or transformers folders, which
are encoded the way sentence-transformers encodes them (its ``encode_query`` / ``encode_document``:
the model's own saved prompts if it has any, none otherwise — all-MiniLM-L6-v2 has none). For a task
with a ``prompt_name`` (an mteb task name), a model's per-task prompts ``<prompt_name>-query`` /
``<prompt_name>-document`` are used when it has them, as mteb uses them (what ``obliq export`` writes
for the OBLIQ-Bench tasks).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from obliq.aliases import check_model, resolve_model
from obliq.files import read_json_object, read_text
from obliq.windows import Windows

Kind = Literal["query", "passage"]
EncoderKind = Literal["auto", "sentence-transformers", "obliq"]
if TYPE_CHECKING:
    import torch

OBLIQ_CONFIG = "obliq_encoder.json"  # written by BiEncoder.save_pretrained


class Encoder(Protocol):
    """The protocol evaluation needs, and all an evaluator may set: per call, the ``kind`` of text,
    the ``batch_size`` and a token ``max_length`` (the evaluation's, which the encoder cuts to its
    capacity; None keeps the encoder's own). Nothing else of an encoder is changed by evaluating it."""

    def encode(self, texts: list[str], kind: Kind = "query", batch_size: int = 32, max_length: int | None = None):
        """(n, d) vectors (torch or numpy, any float dtype) for n texts; rows need not be unit norm.
        An encoder may also take a ``task`` keyword (the :class:`obliq.tasks.Task` being retrieved:
        its instruction or per-task prompt); evaluation passes it only to an encoder that takes it."""
        ...

    def text_policy(self, query_max_length: int | None = None, passage_max_length: int | None = None) -> dict:
        """``{"query_prefix", "passage_prefix", "query_max_length", "passage_max_length"}``: what the
        encoder actually reads when asked for these lengths (the report states it), optionally for a
        ``task`` keyword. Optional: an encoder without it (a teacher that reads whole texts) is
        reported as such."""
        ...


class SentenceTransformerEncoder:
    """A sentence-transformers model behind the :class:`Encoder` protocol.

    A transformers folder without sentence-transformers files gets sentence-transformers' default
    (mean pooling). Texts are cut at the model's own ``max_seq_length`` or at a call's ``max_length``,
    whichever is shorter.

    Args:
        name_or_path: an alias (``minilm``, see :mod:`obliq.aliases`), a folder or a hub id.
        device: torch device; None lets sentence-transformers pick (CUDA when available).
        trust_remote_code: run the model's own Python code from its folder or the hub (off unless asked).
    """

    def __init__(self, name_or_path: str, device: str | None = None, trust_remote_code: bool = False):
        from sentence_transformers import SentenceTransformer

        from obliq.model.bidirectional import check_file_weights, check_model_code

        self.name_or_path = str(name_or_path)
        path = resolve_model(name_or_path)
        family = check_model_code(path, trust_remote_code)  # a published family (llama_bidirec) read as data
        self.model = SentenceTransformer(path, device=device, trust_remote_code=trust_remote_code)
        transformer = self.model[0]  # its weights all read (sentence-transformers fills missing ones at random)
        if Path(path).is_dir() and hasattr(transformer, "model"):
            folder = Path(path) / _module_path(Path(path))
            check_file_weights(transformer.model, folder, every_weight=family is not None)
        if getattr(self.model, "tokenizer", None) is not None:  # a text model: refused without its vocabulary
            from obliq.model.tokenizer import check_vocabulary

            check_vocabulary(self.model.tokenizer, path)
        self.capacity = self.model.max_seq_length
        # a folder's own per-task lengths (sentence-transformers' query_length / document_length, what obliq
        # export writes): encode_query / encode_document cut there whatever max_seq_length says
        self.lengths = {
            kind: getattr(transformer, f"{side}_length", None) or self.capacity
            for kind, side in (("query", "query"), ("passage", "document"))
        }

    def prompt(self, kind: Kind, task=None) -> str:
        """The prompt this model puts before a ``kind`` text of ``task``: its per-task prompt
        ``<task.prompt_name>-query`` / ``-document`` when it has one (mteb's first lookup), else its
        ``query`` / ``document`` prompt (sentence-transformers' own), else none."""
        prompts = self.model.prompts or {}
        side = "query" if kind == "query" else "document"
        name = getattr(task, "prompt_name", None)
        if name and f"{name}-{side}" in prompts:
            return prompts[f"{name}-{side}"]
        keys = ("query",) if side == "query" else ("document", "passage", "corpus")
        return next((prompts[k] for k in keys if k in prompts), "")

    def text_policy(
        self, query_max_length: int | None = None, passage_max_length: int | None = None, task=None
    ) -> dict:
        """How this model reads texts (of ``task``) when asked for these lengths: its own saved prompts
        (none for all-MiniLM-L6-v2; :meth:`prompt`) and the token lengths it keeps."""

        return {
            "query_prefix": self.prompt("query", task),
            "passage_prefix": self.prompt("passage", task),
            "query_max_length": self._limit("query", query_max_length),
            "passage_max_length": self._limit("passage", passage_max_length),
        }

    def _limit(self, kind: Kind, n: int | None) -> int | None:
        """The tokens this model keeps of a ``kind`` text when asked for ``n``: its own length for the kind
        (:attr:`lengths`) or ``n``, whichever is shorter."""
        limits = [x for x in (self.lengths[kind], n) if x]
        return min(limits) if limits else None

    def encode(
        self,
        texts: Sequence[str],
        kind: Kind = "query",
        batch_size: int = 32,
        max_length: int | None = None,
        show_progress: bool | None = None,
        task=None,
    ) -> torch.Tensor:
        """Encode texts as queries or passages.

        Args:
            texts: n strings.
            kind: ``query`` (``encode_query``) or ``passage`` (``encode_document``).
            batch_size: texts per forward pass.
            max_length: token limit for this call (cut to the model's ``max_seq_length``); None: the model's own.
            show_progress: a progress bar; None shows it when there are more than 8 batches.
            task: the task being retrieved: its per-task prompt is used when the model has one (:meth:`prompt`).

        Returns:
            (n, d) float32 CPU tensor of unit vectors.

        Raises:
            ValueError: an unknown kind.
        """
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        texts = list(texts)
        if show_progress is None:
            show_progress = len(texts) > 8 * batch_size
        self.model.max_seq_length = limit = self._limit(kind, max_length)
        side = "query" if kind == "query" else "document"
        if getattr(self.model[0], f"{side}_length", None):  # the folder's per-task length wins over max_seq_length
            setattr(self.model[0], f"{side}_length", limit)
        fn = self.model.encode_query if kind == "query" else self.model.encode_document
        out = fn(
            texts,
            prompt=self.prompt(kind, task),
            batch_size=batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=show_progress,
        )
        return out.float().cpu()


def _module_path(folder: Path) -> str:
    """The sub-folder of a sentence-transformers folder that holds its Transformer module's weights
    (``modules.json``'s first entry; ``""``: the folder itself, also for a plain transformers folder)."""
    try:
        modules = json.loads(read_text(folder / "modules.json"))
        return str(modules[0].get("path", "")) if isinstance(modules, list) and modules else ""
    except (OSError, ValueError, AttributeError):
        return ""


def fingerprint(model: str) -> str:
    """A string that changes when what ``model`` loads changes (the corpus-embedding store is found by it).

    - A local file or folder: its absolute path plus every file's relative path, size, mtime, ctime and
      inode (a file rewritten in place, even to the same size and mtime, gets a new ctime).
    - An adapter folder (obliq's ``obliq_encoder.json`` with ``is_adapter``, or peft's
      ``adapter_config.json``): also its base model's fingerprint, since the base is loaded too.
    - A hub id: the snapshot the Hugging Face cache resolves it to (``snapshots/<commit>``, whose files are
      fingerprinted as a folder's), so a moved revision is another model; the bare name only when nothing
      is cached (nothing can be loaded offline then).
    """
    path = Path(resolve_model(model))
    if not path.exists():
        path = _hub_snapshot(model)
        if path is None:
            return model
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    stats = []
    for p in files:
        st = p.stat()
        stats.append(
            (str(p.relative_to(path)) if p != path else p.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        )
    digest = hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]
    base = _adapter_base(path)
    return f"{path.resolve()}@{digest}" + (f" on {fingerprint(base)}" if base else "")


def _adapter_base(path: Path) -> str | None:
    """The base model an adapter folder loads (a relative path read from the folder,
    :func:`obliq.model.adapter.resolve_base`), or None (not an adapter, or unreadable or ambiguous: then no
    base; loading it refuses the same)."""
    from obliq.model.adapter import resolve_base

    if not path.is_dir():
        return None
    try:
        if (path / OBLIQ_CONFIG).is_file():
            saved = json.loads(read_text(path / OBLIQ_CONFIG))
            return (
                resolve_base(path / OBLIQ_CONFIG, "backbone", str(saved["backbone"]))
                if saved.get("is_adapter")
                else None
            )
        if (path / "adapter_config.json").is_file():
            base = str(json.loads(read_text(path / "adapter_config.json"))["base_model_name_or_path"])
            return resolve_base(path / "adapter_config.json", "base_model_name_or_path", base)
    except (ValueError, KeyError, TypeError):
        return None
    return None


def _hub_snapshot(model: str) -> Path | None:
    """The folder the Hugging Face cache resolves a hub id to (its ``refs/main`` commit), or None."""
    if "/" not in model or model.count("/") > 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # not cached, not a valid id: nothing to fingerprint
        return None


def saved_windows(model: str, encoder: EncoderKind = "auto") -> Windows | None:
    """The windows a saved obliq model reads long texts in (its ``obliq_encoder.json``), read without loading it,
    so that a command refuses what they cannot do before any weight loads; None for any other model, or where
    ``encoder`` is ``sentence-transformers`` (which reads texts its own way).

    Raises:
        ValueError: the file is not one JSON object, or its ``windows`` are bad (file named).
    """
    file = Path(str(model)) / OBLIQ_CONFIG
    if encoder == "sentence-transformers" or not file.is_file():
        return None
    return Windows.of(read_json_object(file).get("windows"), f"{file}: windows")


def load_encoder(model: str, encoder: EncoderKind = "auto", trust_remote_code: bool = False) -> Encoder:
    """Load what ``model`` names.

    ``encoder="auto"`` decides from the files:

    - a folder with ``obliq_encoder.json`` (obliq's trained model or LoRA adapter):
      ``BiEncoder.from_pretrained``;
    - a folder with a peft ``adapter_config.json`` only: ``BiEncoder`` on the adapter's base model;
    - a Lightning ``.ckpt`` file: not supported yet (see the error);
    - anything else (an alias, a sentence-transformers or transformers folder, a hub id):
      :class:`SentenceTransformerEncoder`.

    ``encoder="obliq"`` forces ``BiEncoder`` (prefixes, mean pooling) on any backbone;
    ``encoder="sentence-transformers"`` forces :class:`SentenceTransformerEncoder`.
    ``trust_remote_code`` lets either run a model's own code (off unless asked).

    Raises:
        ValueError: a Lightning checkpoint file (export it first).
        FileNotFoundError / OSError: from the loaders when the model cannot be found offline.
    """
    import pickle

    from obliq.errors import weights_only_refusal

    check_model(model)  # damaged weights, a path of the wrong kind, a hub id not cached offline: one line
    try:
        return _load_encoder(model, encoder, trust_remote_code)
    except pickle.UnpicklingError as err:  # a pickled pytorch_model.bin holding more than tensors
        raise weights_only_refusal(err, f"{model} (its pytorch_model.bin or another pickle)") from None


def _load_encoder(model: str, encoder: EncoderKind, trust_remote_code: bool) -> Encoder:
    path = Path(model)
    kwargs = dict(trust_remote_code=trust_remote_code)
    if encoder == "sentence-transformers":
        return SentenceTransformerEncoder(model, **kwargs)
    if encoder == "auto" and path.is_file() and path.suffix == ".ckpt":
        raise ValueError(
            f"{model}: evaluating a Lightning checkpoint directly is not supported yet; save the encoder "
            "with BiEncoder.save_pretrained (or `obliq export`) and pass that folder"
        )
    if encoder == "obliq" or (path / OBLIQ_CONFIG).is_file() or (path / "adapter_config.json").is_file():
        import torch

        from obliq.model import BiEncoder

        if (path / OBLIQ_CONFIG).is_file():
            enc = BiEncoder.from_pretrained(path, **kwargs)
        elif (path / "adapter_config.json").is_file():
            from obliq.model.adapter import adapter_base, st_reading

            enc = BiEncoder(adapter_base(path), adapter=str(path), **st_reading(path), **kwargs)
        else:
            enc = BiEncoder(model, **kwargs)
        if torch.cuda.is_available():
            enc = enc.to("cuda")
        return enc.eval()
    return SentenceTransformerEncoder(model, **kwargs)
