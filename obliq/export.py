"""Export a training checkpoint: the LoRA adapter (peft format) and, on request, a merged
sentence-transformers folder that loads with ``SentenceTransformer(path)`` and no obliq import.

The merged folder's sentence-transformers prompts hold the prefixes (``query`` / ``document``) and, for
each OBLIQ-Bench task, per-task prompts keyed as mteb looks them up (``OBLIQBenchWritingRetrieval-query``
/ ``-document``): the text obliq's encoder puts before that task's queries — with the OBLIQ-IR paper's
B.3 instruction when the model was trained with instructions (``use_instructions``), the plain prefix
otherwise — so mteb reads each task's queries the way the model was trained to read them.

The merge is computed in float32 and cast to the training dtype once (the model card's caveat:
folding ``W + BA·scaling`` directly in bf16 loses digits), then checked on a probe set against the
adapter path: every cosine between merged and adapter embeddings must be ≥ ``min_cosine``, or the
merged folder is removed and the export refuses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from obliq import __version__
from obliq.aliases import portable_name
from obliq.files import claim_output, read_text, write_json, write_text
from obliq.model.checkpoint import load_checkpoint, read_checkpoint
from obliq.model.encoder import BiEncoder
from obliq.tasks.obliq_bench import OBLIQ_BENCH

PROBE = [
    "A passage in the same restless, aphoristic voice as this one.",
    "The witness declined to answer and turned the question back on the committee.",
    "Find problems solved by the pigeonhole principle.",
    "Tweets that quietly oppose the policy without naming it.",
    "The court adjourned; nobody expected the verdict, least of all the defendant's lawyers.",
    "Short.",
]


def _probe_embeddings(encode, texts: list[str]) -> torch.Tensor:
    return torch.cat([encode(texts, "query"), encode(texts, "passage")])


def export(
    checkpoint: Path,
    out: Path,
    merge: bool = False,
    min_cosine: float = 0.999,
    probe_file: Path | None = None,
    results: Path | None = None,
    backbone: str | None = None,
    trust_remote_code: bool = False,
    overwrite: bool = False,
) -> dict:
    """Write ``<out>/adapter`` (peft adapter + obliq settings) and, with ``merge``, ``<out>/merged``,
    each with a model card (``README.md``, Hugging Face format: base model, training data and doses,
    the recipe's settings, the evaluation table when ``results`` is given, how to load it).

    Args:
        checkpoint: a training checkpoint (``.ckpt``).
        out: output folder.
        merge: also write a merged sentence-transformers folder (prompts ``query`` / ``document``
            hold the prefixes, and per-task prompts for mteb's OBLIQ-Bench tasks, :func:`task_prompts`;
            mean pooling; normalisation).
        min_cosine: the least cosine between merged and adapter embeddings on the probe set.
        probe_file: texts to probe with, one per line (default: a built-in set).
        results: an ``evaluate`` output folder of this model (``<task>/summary.json``): its metrics go
            into the model card.
        backbone: the backbone you expect the checkpoint to be trained on; refused if it names another
            (default: the checkpoint's own).
        trust_remote_code: let the backbone run its own code. Only ever from you: a checkpoint's stored
            settings cannot switch it on.
        overwrite: replace an earlier export in ``out`` (refused otherwise).

    Returns:
        What was written and the probe's minimum cosine.

    Raises:
        FileExistsError: ``out`` holds an earlier export and ``overwrite`` is false.
        ValueError: the merged model's embeddings drift below ``min_cosine`` (nothing merged is kept);
            the checkpoint's backbone is not ``backbone``.
    """
    out = Path(out)
    ckpt = read_checkpoint(checkpoint)
    evaluation = _evaluation(Path(results)) if results is not None else []
    claim_output(out, overwrite, "an export")
    trust = dict(backbone=backbone, trust_remote_code=trust_remote_code)
    encoder = load_checkpoint(checkpoint, ckpt, **trust)
    adapter_dir = out / "adapter"
    for stale in (adapter_dir, out / "merged"):  # a previous export's (overwrite asked): never mix two checkpoints
        shutil.rmtree(stale, ignore_errors=True)
    encoder.save_pretrained(adapter_dir)
    write_text(adapter_dir / "README.md", model_card(ckpt, encoder, "adapter", evaluation))
    report = {"checkpoint": str(checkpoint), "adapter": str(adapter_dir)}
    if merge:
        probe = read_text(probe_file).splitlines() if probe_file else PROBE
        report.update(merge_to_sentence_transformers(checkpoint, ckpt, out / "merged", probe, min_cosine, trust))
        write_text(out / "merged" / "README.md", model_card(ckpt, encoder, "merged", evaluation))
    write_json(out / "export.json", report)
    return report


def merge_to_sentence_transformers(
    checkpoint: Path, ckpt: dict, folder: Path, probe: list[str], min_cosine: float, trust: dict
) -> dict:
    """Merge LoRA in float32, cast once to the training dtype, save and verify a sentence-transformers folder."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer

    encoder = load_checkpoint(checkpoint, ckpt, dtype="float32", **trust)
    expect = _probe_embeddings(encoder.encode, probe)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[encoder.settings["dtype"]]
    model = encoder.model.merge_and_unload() if encoder.is_peft else encoder.model
    model = model.to(dtype)
    folder = Path(folder)
    hf_dir = folder.with_name(folder.name + ".hf-tmp")
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.save_pretrained(hf_dir)  # config.is_causal=False travels with a bidirectional decoder
    encoder.tokenizer.save_pretrained(hf_dir)
    try:
        s = encoder.settings
        # The model's capacity (as obliq's own encoder caps it), not the training length: a merged
        # folder then encodes the text an adapter would under the same evaluation settings.
        capacity = encoder.text.capacity or s["passage_max_length"]
        transformer = Transformer(str(hf_dir), max_seq_length=capacity)
        st = SentenceTransformer(
            modules=[transformer, Pooling(encoder.hidden_size, "mean"), Normalize()],
            prompts=task_prompts(encoder),
            device="cpu",
        )
        shutil.rmtree(folder, ignore_errors=True)
        st.save(str(folder))
    finally:
        shutil.rmtree(hf_dir, ignore_errors=True)

    loaded = SentenceTransformer(str(folder), device="cpu")

    def st_encode(texts, kind):
        fn = loaded.encode_query if kind == "query" else loaded.encode_document
        loaded.max_seq_length = encoder.settings[f"{kind}_max_length"]
        return fn(texts, convert_to_tensor=True, normalize_embeddings=True).float().cpu()

    got = _probe_embeddings(st_encode, probe)
    cosine = float((got * expect).sum(-1).min())
    if cosine < min_cosine:
        shutil.rmtree(folder, ignore_errors=True)
        raise ValueError(
            f"merged model drifts from the adapter: min cosine {cosine:.5f} < {min_cosine} on {len(probe)} probe "
            "texts; use the adapter export (or merge to float32)"
        )
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


def _evaluation(results: Path) -> list[dict]:
    """The per-task summaries of an ``evaluate`` output folder.

    Raises:
        FileNotFoundError: the folder holds no ``<task>/summary.json``.
    """
    summaries = [json.loads(read_text(p)) for p in sorted(results.glob("*/summary.json"))]
    if not summaries:
        raise FileNotFoundError(f"{results}: no <task>/summary.json (an evaluate output folder)")
    return summaries


def model_card(ckpt: dict, encoder: BiEncoder, kind: str, evaluation: list[dict]) -> str:
    """A Hugging Face model card (``README.md``) for an exported adapter (``kind="adapter"``) or merged
    sentence-transformers folder (``"merged"``), built from the checkpoint's own record of its training:
    the base model by its portable name, the encoder's settings, LoRA, the loss and optimiser settings,
    the training sources with their rows per epoch (the doses), and the evaluation table when given."""
    settings, lora = encoder.settings, ckpt["obliq"]["lora"]
    base = portable_name(settings["backbone"])
    hp = ckpt.get("hyper_parameters", {})
    stats = (ckpt.get("TrainingDataModule") or {}).get("stats") or {}
    library = "peft" if kind == "adapter" else "sentence-transformers"
    lines = [
        "---",
        f"base_model: {base}",
        f"library_name: {library}",
        "pipeline_tag: sentence-similarity",
        "tags:",
        "- obliq",
        "- dense-retrieval",
        "- sentence-transformers",
        "- feature-extraction",
    ]
    lines += (["- lora"] if lora else []) + [
        "---",
        "",
        f"# {base.split('/')[-1]} fine-tuned for oblique queries ({'LoRA adapter' if kind == 'adapter' else 'merged'})",
        "",
        "A bi-encoder for retrieval by a latent attribute of the document (stance, technique, style, a lossy "
        f"recollection), trained with obliq {__version__} (the OBLIQ-IR recipe: InfoNCE with GradCache on "
        "synthetic queries and kNN-graph pairs from a frozen specialist).",
        "",
        "## Model",
        "",
        "| setting | value |",
        "|---|---|",
        f"| base model | `{base}` |",
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
        lines.append(
            f"| LoRA | r {lora['r']}, alpha {lora['alpha']}, dropout {lora['dropout']}, targets "
            f"{', '.join(lora['target_modules'] or _targets(encoder))} |"
        )
    lines += [
        "",
        "## Training",
        "",
        "| setting | value |",
        "|---|---|",
        f"| optimizer steps | {ckpt.get('global_step', '?')} (epoch {ckpt.get('epoch', '?')}) |",
    ]
    loss = ckpt["obliq"].get("loss") or {}  # the loss's own citation() and settings, saved with the weights
    if loss:
        rest = {k: v for k, v in loss.items() if k not in ("loss", "references", "temperature", "scale")}
        settings_text = ", ".join(
            [f"temperature {loss['temperature']} (scale {loss['scale']:g})"] * ("temperature" in loss)
            + [f"{k.replace('_', ' ')}: {v}" for k, v in rest.items()]
        )
        lines.append(f"| loss | {loss.get('loss')}: {settings_text} |")
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
        ]
    else:
        lines += [
            "With obliq: `obliq evaluate --model path/to/this/folder --tasks …`, or",
            "",
            "```python",
            "from obliq.eval.encoders import load_encoder",
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
            f'tokenizer = AutoTokenizer.from_pretrained("{base}")',
            f'model = PeftModel.from_pretrained(AutoModel.from_pretrained("{base}"), "path/to/this/folder").eval()',
            f'batch = tokenizer([{settings["query_prefix"]!r} + "your query"], return_tensors="pt", padding=True)',
            "hidden = model(**batch).last_hidden_state",
            'mask = batch["attention_mask"].unsqueeze(-1).float()',
            "embedding = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)",
            "```",
        ]
        if encoder.bidirectional and getattr(encoder.backbone_config, "is_causal", None) is False:
            lines += [
                "",
                "The backbone is a decoder made bidirectional: set `config.is_causal = False` and each "
                "attention module's `is_causal = False` before use (obliq's loader does).",
            ]
    return "\n".join(lines) + "\n"


def _targets(encoder: BiEncoder) -> list[str]:
    config = next(iter(encoder.model.peft_config.values()))
    return sorted(config.target_modules)
