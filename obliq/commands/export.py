"""``obliq export``: a training checkpoint exported as the LoRA adapter (peft format) and, on request, a merged
sentence-transformers folder that loads with ``SentenceTransformer(path)`` and no obliq import.

The merged folder's sentence-transformers prompts hold the prefixes (``query`` / ``document``) and, for
each OBLIQ-Bench task, per-task prompts keyed as mteb looks them up (``OBLIQBenchWritingRetrieval-query``
/ ``-document``): the text obliq's encoder puts before that task's queries — with the OBLIQ-IR paper's
B.3 instruction when the model was trained with instructions (``use_instructions``), the plain prefix
otherwise — so mteb reads each task's queries the way the model was trained to read them.

The merged folder carries the lengths the encoder reads at: sentence-transformers' ``encode_query`` /
``encode_document`` cut queries and documents where obliq trained and evaluated them (C68).

The merge is computed and stored in the dtype the checkpoint's encoder is rebuilt in, float32 (the model
card's caveat: folding ``W + BA·scaling`` in bf16 loses digits; a bf16 run's merged folder stays float32,
since a bfloat16 copy drops most of a few steps' LoRA update, docs/training.md). Both folders are then
checked on a probe set (with a text longer than both lengths) against an independent reading of the input
(:mod:`obliq.model.plain`: an adapter folder read by transformers + peft; a checkpoint by its rebuilt
encoder), each read as its user reads it: the adapter by transformers + peft, the merged folder by plain
``SentenceTransformer(folder)``. Every cosine must be ≥ ``min_cosine``, or the export refuses (C60).

A model that reads long texts in token windows (:mod:`obliq.windows`, issue 55) keeps them: the adapter's
``obliq_encoder.json`` records them, and so does the merged folder's (written for such a model only, so that obliq
reads it in windows as it reads the adapter; a folder without windows stays a plain sentence-transformers folder).
Both folders read a text plainly as one window (the merged folder's ``document_length`` is the window's size, and
its queries' too when they are windowed): the probe checks that reading, and the cards say that plain
sentence-transformers (and transformers + peft) give obliq's vector for a text within one window and the first
window's for a longer one (:func:`obliq.model.card.model_card`). No module windows texts in sentence-transformers:
it imports a module outside its own namespace only with ``trust_remote_code=True``
(``sentence_transformers.util.misc.import_module_class``, 6.x), which obliq never asks of a user.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from obliq.claims import claim_outputs
from obliq.files import read_text, write_json, write_text
from obliq.model.card import card_base_model, card_evaluation, export_lengths, model_card, task_prompts
from obliq.model.checkpoint import EXPORT_RECORD, adapter_checkpoint, load_checkpoint, read_checkpoint, weights_digest
from obliq.model.encoder import CONFIG_NAME, BiEncoder
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
    evaluation = card_evaluation(Path(results), digest) if results is not None else []
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
        lengths, plain_length = export_lengths(encoder)
        # the probe reads what both folders read plainly: a text cut at one window when the model reads windows
        one_window = {} if encoder.windows is None else dict(windows=None, **_max_lengths(lengths))
        exact = load_checkpoint(checkpoint, ckpt, dtype="float32", **one_window, **trust)
        texts = probe_texts(probe, exact.tokenizer, exact.text.max_length)
        expect, source = _reference(Path(checkpoint), exact, texts, trust_remote_code)
        report["adapter_probe_min_cosine"] = _check_adapter(adapter_dir, exact, texts, expect, source, min_cosine)
        if merge:
            merged = merge_to_sentence_transformers(
                exact, out / "merged", texts, expect, source, min_cosine, max_seq_length=plain_length
            )
            report.update(merged)
            if encoder.windows is not None:  # obliq reads the merged folder in windows, as it reads the adapter
                settings = _merged_settings(encoder, merged["merged_dtype"], plain_length)
                write_json(out / "merged" / CONFIG_NAME, settings)
            write_json(out / "merged" / EXPORT_RECORD, record)
            write_text(out / "merged" / "README.md", model_card(ckpt, encoder, "merged", evaluation, base))
        write_json(out / "export.json", report)
        return report


def _max_lengths(lengths: dict[str, int]) -> dict[str, int]:
    """``{"query": q, "passage": p}`` as BiEncoder's ``query_max_length`` / ``passage_max_length``."""
    return {f"{kind}_max_length": n for kind, n in lengths.items()}


def _merged_settings(encoder: BiEncoder, dtype: str, capacity: int) -> dict:
    """The ``obliq_encoder.json`` of a merged folder of a model that reads long texts in windows, so that obliq
    (``BiEncoder.from_pretrained``, ``obliq evaluate``, its mteb bridge) reads it in those windows as it reads the
    adapter: the encoder's settings, the weights in this folder (``backbone`` ``.``: read from the folder itself,
    no LoRA), stored in ``dtype``; the max lengths within the folder's ``max_seq_length`` (``capacity``, which
    obliq reads as the backbone's positions: a windowed kind is read at its window, the others at lengths
    within it, so nothing read changes)."""
    lengths = {kind: min(n, capacity) for kind, n in encoder.text.max_length.items()}
    return dict(encoder.settings, **_max_lengths(lengths), backbone=".", dtype=dtype, lora=None, is_adapter=False)


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
    encoder: BiEncoder,
    folder: Path,
    texts: list[str],
    expect: dict,
    source: str,
    least: float,
    max_seq_length: int | None = None,
) -> dict:
    """Merge LoRA in the encoder's dtype (float32 as export rebuilds it), save and verify a sentence-transformers
    folder. It carries the lengths the encoder reads at (``query_length`` / ``document_length`` in
    ``sentence_bert_config.json``: ``encode_query`` / ``encode_document`` cut there; ``max_seq_length``,
    for a plain ``encode``, is ``max_seq_length``, by default the passage length). Loaded fresh as a plain user loads it
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
            max_seq_length=max_seq_length or lengths["passage"],
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
