"""The model card (``README.md``) of an exported adapter or merged sentence-transformers folder
(``obliq export``, :mod:`obliq.commands.export`): its ``base_model`` by Hub id, the encoder's and the
training's settings from the checkpoint's own record, the evaluation table; and the per-task prompts a
merged folder carries for mteb (:func:`task_prompts`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from obliq import __version__
from obliq.aliases import portable_name
from obliq.files import read_text
from obliq.model.encoder import BiEncoder
from obliq.tasks.obliq_bench import OBLIQ_BENCH


def _is_hub_id(name: str) -> bool:
    """Whether ``name`` is a Hub model id (``owner/name``) and not a path on this machine."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.count("/") != 1 or name.startswith((".", "~", "/")) or os.path.exists(os.path.expanduser(name)):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def card_base_model(backbone: str, given: str | None = None) -> str | None:
    """The card's ``base_model`` (C35): ``given`` (checked), else the backbone's Hub id when it is known —
    an alias or a packaged model (:func:`obliq.aliases.portable_name`), a Hub id, or a folder of the Hub
    cache (``…/models--<owner>--<name>/snapshots/<revision>``) — else None: a local folder (a copy, a
    locally fine-tuned model) has no Hub id, and its config's ``_name_or_path`` names the model *it*
    came from, not it. The Hub rejects a card whose base model is a path, and a path tells the world
    about the trainer's disk.

    Raises:
        ValueError: ``given`` is not a Hub model id.
    """
    if given is not None:
        if not _is_hub_id(given):
            raise ValueError(f"base_model {given!r} is not a Hub model id (owner/name)")
        return given
    name = portable_name(backbone)
    if _is_hub_id(name):
        return name
    cached = re.search(r"models--([\w.-]+)--([\w.-]+)[/\\]snapshots[/\\]", name)
    if cached and _is_hub_id(f"{cached[1]}/{cached[2]}"):
        return f"{cached[1]}/{cached[2]}"
    return None


def task_prompts(encoder: BiEncoder) -> dict[str, str]:
    """The sentence-transformers prompts of a merged export: ``query`` / ``document`` (the prefixes)
    and, for every OBLIQ-Bench task, ``<mteb task>-query`` (what ``encoder`` puts before that task's
    queries: the B.3 instruction when it uses instructions, :data:`obliq.tasks.obliq_bench.OBLIQ_BENCH`)
    and ``<mteb task>-document`` (the passage prefix). mteb uses ``-query`` / ``-document`` keys of
    registered task names first (``mteb.models.abs_encoder.get_prompt_name``)."""
    passage = encoder.text.format([""], "passage")[0]
    prompts = {"query": encoder.text.format([""], "query")[0], "document": passage}
    for name, bench in OBLIQ_BENCH.items():
        prompts[f"{name}-query"] = encoder.text.format([""], "query", [bench.instruction])[0]
        prompts[f"{name}-document"] = passage
    return prompts


def export_lengths(encoder: BiEncoder) -> tuple[dict[str, int], int]:
    """The tokens the exported folders read one text at, per kind (``query``, ``passage``), and a merged folder's
    ``max_seq_length`` (a plain sentence-transformers ``encode``).

    Without windows: the encoder's max lengths, and the passage length. With windows (:mod:`obliq.windows`), a
    text is read as one window of ``windows.size`` tokens (cut to the backbone's positions): passages, and
    queries when ``windows.queries``; so a text within one window is read whole, as obliq reads it. The
    ``max_seq_length`` is then the longer of the two, since obliq reading the merged folder takes it for the
    backbone's capacity (:func:`obliq.model.backbone.model_capacity`) and must keep the query length.
    """
    lengths = dict(encoder.text.max_length)
    windows = encoder.windows
    if windows is None:
        return lengths, lengths["passage"]
    lengths["passage"] = encoder.text.cap(windows.size)
    if windows.queries:
        lengths["query"] = encoder.text.cap(windows.size)
    return lengths, max(lengths.values())


def card_evaluation(results: Path, digest: str) -> list[dict]:
    """The per-task summaries of an ``evaluate`` output folder of an export of this checkpoint (the card's
    evaluation table, :func:`model_card`).

    Raises:
        FileNotFoundError: the folder holds no ``<task>/summary.json``.
        ValueError: a task summary of another model (each summary holds the evaluated folder's export
            record, :data:`~obliq.model.checkpoint.EXPORT_RECORD`, whose weights digest must be this
            checkpoint's).
    """
    summaries = [json.loads(read_text(p)) for p in sorted(results.glob("*/summary.json"))]
    if not summaries:
        raise FileNotFoundError(f"{results}: no <task>/summary.json (an evaluate output folder)")
    for summary in summaries:
        record = summary.get("model_export") or {}
        if record.get("weights_sha256") != digest:
            raise ValueError(
                f"{results}/{summary.get('task')}: evaluates {summary.get('model')!r}, which is not an export of "
                f"this checkpoint (its export record {'names other weights' if record else 'is missing'}): "
                "evaluate this export's adapter or merged folder and pass that evaluation"
            )
    return summaries


def model_card(ckpt: dict, encoder: BiEncoder, kind: str, evaluation: list[dict], base: str | None) -> str:
    """A Hugging Face model card (``README.md``) for an exported adapter (``kind="adapter"``) or merged
    sentence-transformers folder (``"merged"``), built from the checkpoint's own record of its training:
    the base model by its Hub id (``base``, :func:`card_base_model`; None: no ``base_model`` line, a local
    base), the encoder's settings, LoRA, the loss and optimiser settings, the training sources with their
    rows per epoch (the doses), and the evaluation table when given. No path of this machine appears in
    it: sources are named by their file names, and the usage code names the base by its Hub id or a
    placeholder."""
    settings, lora = encoder.settings, ckpt["obliq"]["lora"]
    lengths, plain_length = export_lengths(encoder)
    hp = ckpt.get("hyper_parameters", {})
    stats = (ckpt.get("TrainingDataModule") or {}).get("stats") or {}
    library = "peft" if kind == "adapter" else "sentence-transformers"
    lines = (
        ["---"]
        + ([f"base_model: {base}"] if base else [])
        + [
            f"library_name: {library}",
            "pipeline_tag: sentence-similarity",
            "tags:",
            "- obliq",
            "- dense-retrieval",
            "- sentence-transformers",
            "- feature-extraction",
        ]
    )
    lines += (["- lora"] if lora else []) + [
        "---",
        "",
        f"# {base.split('/')[-1] if base else 'A bi-encoder'} fine-tuned for oblique queries "
        f"({'LoRA adapter' if kind == 'adapter' else 'merged'})",
        "",
        "A bi-encoder for retrieval by a latent attribute of the document (stance, technique, style, a lossy "
        f"recollection), trained with obliq {__version__} (the OBLIQ-IR recipe: InfoNCE with GradCache on "
        "synthetic queries and kNN-graph pairs from a frozen specialist).",
        "",
        "## Model",
        "",
        "| setting | value |",
        "|---|---|",
        f"| base model | {f'`{base}`' if base else 'a local model, not on the Hub'} |",
        f"| architecture | {encoder.backbone_config.model_type}, "
        f"{'bidirectional' if encoder.bidirectional else 'causal'} attention |",
        "| pooling | mean over non-padding tokens, then L2 normalisation |",
        f"| embedding size | {encoder.hidden_size} |",
        f"| prefixes | query `{settings['query_prefix']!r}`, passage `{settings['passage_prefix']!r}` |",
        f"| max length (training) | query {settings['query_max_length']}, "
        f"passage {settings['passage_max_length']} tokens |",
        f"| weights dtype | {settings['dtype']} |",
    ]
    if encoder.windows is not None:
        lines.append(f"| long texts | {_windows_text(encoder)} |")
    if lora:
        lines.append(f"| LoRA | {_lora_text(lora, encoder)} |")
    lines += [
        "",
        "## Training",
        "",
        "| setting | value |",
        "|---|---|",
    ]
    mixed = ckpt["obliq"].get("interpolation")  # obliq interpolate: the steps are the newest source's
    when = "the newest of the interpolated checkpoints" if mixed else f"epoch {ckpt.get('epoch', '?')}"
    if ckpt["obliq"].get("imported"):  # an adapter folder trained elsewhere: its training is not known here
        lines.append(f"| source | the adapter folder `{ckpt['obliq']['imported']}` (its training is not recorded) |")
    else:
        lines.append(f"| optimizer steps | {ckpt.get('global_step', '?')} ({when}) |")
    if mixed:
        sources = ", ".join(
            f"{Path(s['checkpoint']).name} (step {s['step']}, share {s['weight']:g})" for s in mixed["sources"]
        )
        lines.append(
            f"| interpolation | `obliq interpolate`: alpha {mixed['alpha']:g} (the share of the trained update kept; "
            f"0: the base model); {sources} |"
        )
    loss = ckpt["obliq"].get("loss") or {}  # the loss's own citation() and settings, saved with the weights
    if loss:
        rest = {k: v for k, v in loss.items() if k not in ("loss", "references", "temperature", "scale")}
        settings_text = ", ".join(
            [f"temperature {loss['temperature']} (scale {loss['scale']:g})"] * ("temperature" in loss)
            + [f"{k.replace('_', ' ')}: {v}" for k, v in rest.items()]
        )
        lines.append(f"| loss | {loss.get('loss')}: {settings_text} |")
        for term in ckpt["obliq"].get("terms") or []:  # each term's citation(): name, settings, source
            args = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in term.items() if k not in ("term", "references"))
            lines.append(f"| term | {term.get('term')}: {args} ({'; '.join(term.get('references') or [])}) |")
        if loss.get("references"):
            lines.append(f"| references | {'; '.join(loss['references'])} |")
    if "lr" in hp:
        lines.append(
            f"| optimizer | AdamW, lr {hp['lr']}, weight decay {hp.get('weight_decay')}, warmup ratio "
            f"{hp.get('warmup_ratio')} then linear decay, gradient clip {hp.get('max_grad_norm')} |"
        )
    if stats.get("sources"):
        lines += [
            "",
            "Training data (rows per epoch = the dose of each source):",
            "",
            "| source | rows | rows per epoch |",
            "|---|---:|---:|",
        ]
        lines += [f"| `{Path(src['path']).name}` | {src['rows']} | {src['per_epoch']} |" for src in stats["sources"]]
    if evaluation:
        panel = list(evaluation[0]["metrics"])
        lines += [
            "",
            "## Evaluation",
            "",
            "Gold qrels, trec_eval conventions (`obliq evaluate`).",
            "",
            "| task | queries | " + " | ".join(panel) + " |",
            "|---|---:|" + "---:|" * len(panel),
        ]
        lines += [
            f"| {e['task']} | {e['n_queries']} | "
            + " | ".join("–" if e["metrics"].get(m) is None else f"{e['metrics'][m]:.4f}" for m in panel)
            + " |"
            for e in evaluation
        ]
    lines += ["", "## Usage", ""]
    if kind == "merged":
        lines += [
            "With sentence-transformers (the prompts add the prefixes):",
            "",
            "```python",
            "from sentence_transformers import SentenceTransformer",
            "",
            'model = SentenceTransformer("path/to/this/folder")',
            'queries = model.encode_query(["posts that quietly oppose the new policy"])',
            'docs = model.encode_document(["..."])',
            "scores = queries @ docs.T",
            "```",
            "",
            f"`encode_query` reads queries up to {lengths['query']} tokens and `encode_document` "
            f"documents up to {lengths['passage']} (`query_length` / `document_length` in "
            "`sentence_bert_config.json`), the lengths the model was trained and evaluated at"
            + (" (one window)" if encoder.windows is not None else "")
            + "; a plain `encode` reads "
            + ("at the document length." if plain_length == lengths["passage"] else f"up to {plain_length} tokens."),
        ]
    else:
        lines += [
            "With obliq: `obliq evaluate --model path/to/this/folder --tasks …`, or",
            "",
            "```python",
            "from obliq.search.encoders import load_encoder",
            "",
            'encoder = load_encoder("path/to/this/folder")',
            'q = encoder.encode(["posts that quietly oppose the new policy"], kind="query")',
            "```",
            "",
            "With transformers and peft (prefix the texts, mean-pool over the attention mask, L2-normalise):",
            "",
            "```python",
            "import torch",
            "from peft import PeftModel",
            "from transformers import AutoModel, AutoTokenizer",
            "",
            f'tokenizer = AutoTokenizer.from_pretrained("{base or "path/to/the/base/model"}")',
            "tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token",
            f'base = AutoModel.from_pretrained("{base or "path/to/the/base/model"}")',
        ]
        if encoder.bidirectional and getattr(encoder.backbone_config, "is_causal", None) is False:
            lines += [
                "base.config.is_causal = False  # a decoder made bidirectional: the config and every attention module",
                "for module in base.modules():",
                "    if getattr(module, 'is_causal', None) is True:",
                "        module.is_causal = False",
            ]
        lines += [
            'model = PeftModel.from_pretrained(base, "path/to/this/folder").eval()',
            f'texts = [{settings["query_prefix"]!r} + "your query"]  # plain text: no chat template',
            f'batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, '
            f"max_length={lengths['query']})",
            "with torch.no_grad():",
            "    hidden = model(**batch).last_hidden_state",
            'mask = batch["attention_mask"].unsqueeze(-1).float()',
            "embedding = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)",
            "```",
        ]
    if encoder.windows is not None:
        lines += _windows_usage(encoder, kind, lengths, plain_length)
    return "\n".join(lines) + "\n"


def _windows_text(encoder: BiEncoder) -> str:
    """The card's row on long texts: the windows and how a text's windows make its representation."""
    w = encoder.windows
    document = (
        "the mean of its windows' vectors, L2-normalised"
        if w.reduce == "mean"
        else "its windows' vectors, scored by its best window (MaxSim)"
    )
    queries = "read in windows too" if w.queries else f"one window, cut at {encoder.text.max_length['query']} tokens"
    return (
        f"windows of {encoder.text.cap(w.size)} tokens, {w.stride} apart (the special tokens and the prefix in each, "
        f"at most {w.max_windows} a text); a document is {document}; queries: {queries} (obliq's `windows`, recorded "
        "in `obliq_encoder.json`)"
    )


def _windows_usage(encoder: BiEncoder, kind: str, lengths: dict[str, int], plain_length: int) -> list[str]:
    """The card's section on long documents (issue 55): how obliq reads them, what a plain sentence-transformers
    user (or transformers + peft) gets instead and when it is the same, and obliq's code for obliq's vectors.
    No module is written for sentence-transformers to window with: it loads a module of its own namespace only,
    anything else only with ``trust_remote_code=True`` (``sentence_transformers.util.misc.import_module_class``),
    which nothing obliq writes may ask of its user."""
    w = encoder.windows
    size = encoder.text.cap(w.size)
    mean = w.reduce == "mean"
    if kind == "merged":
        plain = (
            f"Plain sentence-transformers does not: `encode_document` truncates at {lengths['passage']} tokens "
            f"(`document_length`; a plain `encode` at `max_seq_length`, {plain_length})"
        )
    else:
        plain = (
            "transformers + peft as above do not: the snippet truncates at `max_length` "
            f"({lengths['passage']} for documents)"
        )
    lines = [
        "",
        "## Long documents",
        "",
        f"obliq reads a text longer than one window ({size} tokens) in token {_windows_text(encoder)}. {plain}, so "
        "it gives obliq's vector for a text within one window and another one, the first window's, for a longer "
        "text. Windowing in sentence-transformers would take a custom module, which sentence-transformers loads only "
        "with `trust_remote_code=True`; this folder carries none.",
        "",
    ]
    if mean:
        lines += [
            "obliq's vectors (`obliq evaluate --model path/to/this/folder` and obliq's mteb bridge read them so):",
            "",
            "```python",
            "from obliq.model import BiEncoder",
            "",
            'encoder = BiEncoder.from_pretrained("path/to/this/folder")',
            'texts = ["a long document " * 40, "a short one"]',
            'vectors = encoder.encode(texts, "passage")  # (n, d) unit vectors: the mean of each text\'s windows',
            "```",
        ]
    else:
        lines += [
            "A document is then not one vector: `obliq evaluate --model path/to/this/folder` and obliq's search score "
            "it so; mteb scores one vector a document and obliq's mteb bridge refuses this model (read it there with "
            "`retrieval.windows` of `reduce: mean`, the mean of its windows). obliq's scores:",
            "",
            "```python",
            "from obliq.model import BiEncoder",
            "from obliq.windows import maxsim_scores",
            "",
            'encoder = BiEncoder.from_pretrained("path/to/this/folder")',
            'queries = ["posts that quietly oppose the new policy"]',
            'docs = ["a long document " * 40, "a short one"]',
            'q = encoder.encode(queries, "query")',
            'vectors, window_doc = encoder.encode_windows(docs, "passage")',
            "scores = maxsim_scores(q, vectors, window_doc, len(docs))  # (queries, docs): each document's best window",
            "```",
        ]
    return lines


def _lora_text(lora: dict, encoder: BiEncoder) -> str:
    """The card's LoRA row: rank, alpha, dropout, targets, and every other setting that is on."""
    targets = lora.get("target_modules") or sorted(next(iter(encoder.model.peft_config.values())).target_modules)
    parts = [
        f"r {lora['r']}, alpha {lora['alpha']:g}, dropout {lora['dropout']}",
        f"targets {targets if isinstance(targets, str) else ', '.join(targets)}",
    ]
    parts += [name for name in ("use_rslora", "use_dora") if lora.get(name)]
    parts += [f"{name} {lora[name]}" for name in ("exclude_modules", "rank_pattern", "alpha_pattern") if lora.get(name)]
    return ", ".join(parts)
