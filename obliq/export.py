"""Export a training checkpoint: the LoRA adapter (peft format) and, on request, a merged
sentence-transformers folder that loads with ``SentenceTransformer(path)`` and no obliq import.

The merged folder's sentence-transformers prompts hold the prefixes (``query`` / ``document``) and, for
each OBLIQ-Bench task, per-task prompts keyed as mteb looks them up (``OBLIQBenchWritingRetrieval-query``
/ ``-document``): the text obliq's encoder puts before that task's queries — with the OBLIQ-IR paper's
B.3 instruction when the model was trained with instructions (``use_instructions``), the plain prefix
otherwise — so mteb reads each task's queries the way the model was trained to read them.

The merged folder carries the lengths the encoder reads at: sentence-transformers' ``encode_query`` /
``encode_document`` cut queries and documents where obliq trained and evaluated them (C68).

The merge is computed in float32 and cast to the training dtype once (the model card's caveat:
folding ``W + BA·scaling`` directly in bf16 loses digits). Both folders are then checked on a probe set
(with a text longer than both lengths) against an independent reading of the input
(:mod:`obliq.model.plain`: an adapter folder read by transformers + peft; a checkpoint by its rebuilt
encoder), each read as its user reads it: the adapter by transformers + peft, the merged folder by plain
``SentenceTransformer(folder)``. Every cosine must be ≥ ``min_cosine``, or the export refuses (C60).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch

from obliq import __version__
from obliq.aliases import portable_name
from obliq.claims import claim_outputs
from obliq.files import read_text, write_json, write_text
from obliq.model.checkpoint import EXPORT_RECORD, adapter_checkpoint, load_checkpoint, read_checkpoint, weights_digest
from obliq.model.encoder import BiEncoder
from obliq.model.plain import (
    KINDS,
    PROBE,
    differences,
    embeddings,
    min_cosine,
    plain_reader,
    probe_texts,
    st_reader,
)
from obliq.tasks.obliq_bench import OBLIQ_BENCH
from obliq.write_errors import writing

TEXT_ONLY = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
"""The merged folder's ``modality_config``: plain text in, the last hidden states out (no ``message``)."""


def export(
    checkpoint: Path,
    out: Path,
    merge: bool = False,
    min_cosine: float = 0.999,
    probe_file: Path | None = None,
    results: Path | None = None,
    backbone: str | None = None,
    base_model: str | None = None,
    trust_remote_code: bool = False,
    overwrite: bool = False,
) -> dict:
    """Write ``<out>/adapter`` (peft adapter + obliq settings) and, with ``merge``, ``<out>/merged``,
    each with a model card (``README.md``, Hugging Face format: base model, training data and doses,
    the recipe's settings, the evaluation table when ``results`` is given, how to load it).

    Args:
        checkpoint: a training checkpoint (``.ckpt``), or a LoRA adapter folder (obliq's adapter export, or a
            sentence-transformers + peft folder such as the paper's OBLIQ-IR-3B-LoRA:
            :func:`obliq.model.checkpoint.adapter_checkpoint`), merged and verified the same way.
        out: output folder.
        merge: also write a merged sentence-transformers folder (prompts ``query`` / ``document``
            hold the prefixes, and per-task prompts for mteb's OBLIQ-Bench tasks, :func:`task_prompts`;
            mean pooling; normalisation; plain text in, never a chat template).
        min_cosine: the least cosine, in (0, 1], between the written folders' embeddings and the input's
            (:func:`_reference`) on the probe set, batched and one text at a time.
        probe_file: texts to probe with, one per line (blank lines skipped; default: a built-in set).
        results: an ``evaluate`` output folder of this model (``<task>/summary.json``): its metrics go
            into the model card. Refused unless it evaluated an export of this checkpoint.
        backbone: the backbone you expect the checkpoint to be trained on; refused if it names another
            (default: the checkpoint's own).
        base_model: the base model's Hub id for the card's ``base_model`` (default: the backbone's, when
            it is known to come from the Hub: an alias or a Hub id; a local folder gets none).
        trust_remote_code: let the backbone run its own code. Only ever from you: a checkpoint's stored
            settings cannot switch it on.
        overwrite: replace an earlier export in ``out`` (refused otherwise).

    Returns:
        What was written and the probe's minimum cosines (``adapter_probe_min_cosine``, ``probe_min_cosine``).

    Raises:
        FileExistsError: ``out`` holds an earlier export and ``overwrite`` is false.
        ValueError: the written adapter's or merged model's embeddings drift below ``min_cosine`` (nothing is
            kept; the message names what differs); an adapter folder with a LoRA setting obliq does not carry
            (:func:`obliq.model.adapter.lora_settings`); the checkpoint's backbone is not ``backbone``; an empty
            probe file; ``min_cosine`` outside (0, 1]; ``base_model`` not a Hub id; ``results`` of
            another model.
    """
    out = Path(out)
    if not 0 < min_cosine <= 1:
        raise ValueError(f"min_cosine: a cosine lies in [-1, 1] and the check needs (0, 1], got {min_cosine}")
    probe = PROBE
    if probe_file is not None:
        probe = [line for line in read_text(probe_file).splitlines() if line.strip()]
        if not probe:
            raise ValueError(f"{probe_file}: no probe text (one per line): nothing would check the merge")
    if Path(checkpoint).is_dir():  # an adapter folder (the paper's OBLIQ-IR-3B-LoRA, obliq's own adapter export)
        ckpt = adapter_checkpoint(checkpoint, trust_remote_code)
    else:
        ckpt = read_checkpoint(checkpoint)
    base = card_base_model(ckpt["obliq"]["encoder"]["backbone"], base_model)
    for name, tensor in ckpt["state_dict"].items():  # a diverged run's weights are not a model to publish
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                f"{checkpoint}: weight {name!r} is a {type(tensor).__name__}, not a tensor; nothing exported"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{checkpoint}: weight {name!r} holds NaN or infinite values; nothing exported")
    digest = weights_digest(ckpt)
    evaluation = _evaluation(Path(results), digest) if results is not None else []
    trust = dict(backbone=backbone, trust_remote_code=trust_remote_code)
    encoder = load_checkpoint(checkpoint, ckpt, **trust)  # a malformed checkpoint is refused before any claim
    with claim_outputs(
        {"out": out},
        command="export",
        inputs=[checkpoint, probe_file, results],
        overwrite=overwrite,
        what="an export",
        folders=["out"],
    ):
        adapter_dir = out / "adapter"
        record = {
            "checkpoint": Path(checkpoint).name,
            "step": ckpt.get("global_step"),
            "weights_sha256": digest,
            # the dimensions the Matryoshka loss trained (none: only the full one); evaluate warns at another dim
            "matryoshka_dims": ((ckpt["obliq"].get("loss") or {}).get("matryoshka_dims"))
            or (ckpt.get("hyper_parameters") or {}).get("matryoshka_dims")  # a checkpoint of before obliq.losses
            or [],
        }
        if ckpt["obliq"].get("interpolation"):  # obliq interpolate: α and the checkpoints it averaged
            record["interpolation"] = ckpt["obliq"]["interpolation"]
        with writing(adapter_dir):  # a full disk or a file-size limit, named in one line
            encoder.save_pretrained(adapter_dir)
        write_json(adapter_dir / EXPORT_RECORD, record)
        write_text(adapter_dir / "README.md", model_card(ckpt, encoder, "adapter", evaluation, base))
        report = {"checkpoint": str(checkpoint), "adapter": str(adapter_dir), "base_model": base}
        exact = load_checkpoint(checkpoint, ckpt, dtype="float32", **trust)
        texts = probe_texts(probe, exact.tokenizer, exact.text.max_length)
        expect, source = _reference(Path(checkpoint), exact, texts, trust_remote_code)
        report["adapter_probe_min_cosine"] = _check_adapter(adapter_dir, exact, texts, expect, source, min_cosine)
        if merge:
            report.update(merge_to_sentence_transformers(exact, out / "merged", texts, expect, source, min_cosine))
            write_json(out / "merged" / EXPORT_RECORD, record)
            write_text(out / "merged" / "README.md", model_card(ckpt, encoder, "merged", evaluation, base))
        write_json(out / "export.json", report)
        return report


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


def _reading(encoder: BiEncoder, trust_remote_code: bool) -> dict:
    """How ``encoder`` reads texts, as :func:`obliq.model.plain.plain_reader` takes it."""
    s = encoder.settings
    return dict(
        prefixes={"query": s["query_prefix"], "passage": s["passage_prefix"]},
        lengths=dict(encoder.text.max_length),
        bidirectional=encoder.made_bidirectional,
        trust_remote_code=trust_remote_code,
    )


def _reference(checkpoint: Path, exact: BiEncoder, texts: list[str], trust_remote_code: bool) -> tuple[dict, str]:
    """The vectors the written folders must give for ``texts`` (per kind) and what they are: an adapter folder
    read by transformers + peft on its base (:func:`obliq.model.plain.plain_reader`, each text alone), a
    training checkpoint by its encoder rebuilt in float32 (``exact``)."""
    if checkpoint.is_dir():
        read = plain_reader(checkpoint, exact.settings["backbone"], **_reading(exact, trust_remote_code))
        return embeddings(read, texts, one_at_a_time=True), "the input adapter read by transformers + peft"
    return {kind: exact.encode(texts, kind) for kind in KINDS}, "the checkpoint's encoder"


def _check_adapter(folder: Path, exact: BiEncoder, texts: list[str], expect: dict, source: str, least: float) -> float:
    """The written adapter read by transformers + peft as the card says (in one padded batch) must give
    ``expect`` (cosine ≥ ``least``); its minimum cosine.

    Raises:
        ValueError: it does not (the export is withdrawn).
    """
    base = exact.settings["backbone"] if exact.is_peft else None
    read = plain_reader(folder, base, **_reading(exact, False))
    cosine = min_cosine(expect, read, texts, one_at_a_time=False)
    if not cosine >= least:  # NaN fails too
        raise ValueError(
            f"{folder}: the exported adapter, read by transformers + peft, is another model than {source}: min "
            f"cosine {cosine:.5f} < {least} on {len(texts)} probe texts; nothing exported"
        )
    return cosine


def merge_to_sentence_transformers(
    encoder: BiEncoder, folder: Path, texts: list[str], expect: dict, source: str, least: float
) -> dict:
    """Merge LoRA in float32, cast once to the training dtype, save and verify a sentence-transformers
    folder. It carries the lengths the encoder reads at (``query_length`` / ``document_length`` in
    ``sentence_bert_config.json``: ``encode_query`` / ``encode_document`` cut there; ``max_seq_length``,
    for a plain ``encode``, is the passage length). Loaded fresh as a plain user loads it
    (:func:`obliq.model.plain.st_reader`, nothing set by the probe), its embeddings of ``texts`` (which
    hold one longer than both lengths), batched and one at a time, must have cosine ≥ ``least`` with
    ``expect`` (:func:`_reference`, named by ``source``). On failure the folder is removed and the message
    names what differs (:func:`obliq.model.plain.differences`).

    Args:
        encoder: the checkpoint's encoder in float32 (its LoRA is merged into it: not usable afterwards).
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[encoder.settings["dtype"]]
    prompts = task_prompts(encoder)
    model = encoder.model.merge_and_unload() if encoder.is_peft else encoder.model
    model = model.to(dtype)
    folder = Path(folder)
    hf_dir = folder.with_name(folder.name + ".hf-tmp")
    shutil.rmtree(hf_dir, ignore_errors=True)
    with writing(folder, hf_dir):
        model.save_pretrained(hf_dir)  # config.is_causal=False travels with a bidirectional decoder
        encoder.tokenizer.save_pretrained(hf_dir)
    lengths = encoder.text.max_length
    try:
        # Text only (C33): sentence-transformers gives a tokenizer with a chat template a "message"
        # modality and then wraps every plain string in the template, system prompt and all. The
        # chat template stays in the folder for whoever wants it; plain strings stay plain.
        transformer = Transformer(
            str(hf_dir),
            max_seq_length=lengths["passage"],
            query_length=lengths["query"],
            document_length=lengths["passage"],
            modality_config=TEXT_ONLY,
            module_output_name="token_embeddings",
        )
        st = SentenceTransformer(
            modules=[transformer, Pooling(encoder.hidden_size, "mean"), Normalize()], prompts=prompts, device="cpu"
        )
        shutil.rmtree(folder, ignore_errors=True)
        with writing(folder):
            st.save(str(folder))
    finally:
        shutil.rmtree(hf_dir, ignore_errors=True)
    try:
        loaded, read = st_reader(folder)
        batched, single = min_cosine(expect, read, texts, one_at_a_time=False), min_cosine(expect, read, texts)
        cosine = float(torch.tensor([batched, single]).min())  # NaN stays NaN
        if not cosine >= least:  # NaN fails too (NaN < least is False)
            found = differences(loaded, encoder, texts, dtype)
            raise ValueError(
                f"{folder}: the merged model, read by plain sentence-transformers, drifts from {source}: min cosine "
                f"{cosine:.5f} < {least} on {len(texts)} probe texts (batched {batched:.5f}, one at a time "
                f"{single:.5f}); {'; '.join(found) if found else 'no setting differs, the weights do'}. "
                "Nothing merged is kept; the adapter export stands"
            )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return {"merged": str(folder), "merged_dtype": str(dtype).removeprefix("torch."), "probe_min_cosine": cosine}


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


def _evaluation(results: Path, digest: str) -> list[dict]:
    """The per-task summaries of an ``evaluate`` output folder of an export of this checkpoint.

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
            f"`encode_query` reads queries up to {encoder.text.max_length['query']} tokens and `encode_document` "
            f"documents up to {encoder.text.max_length['passage']} (`query_length` / `document_length` in "
            "`sentence_bert_config.json`), the lengths the model was trained and evaluated at; a plain `encode` "
            "reads at the document length.",
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
            f"max_length={encoder.text.max_length['query']})",
            "with torch.no_grad():",
            "    hidden = model(**batch).last_hidden_state",
            'mask = batch["attention_mask"].unsqueeze(-1).float()',
            "embedding = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)",
            "```",
        ]
    return "\n".join(lines) + "\n"


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
