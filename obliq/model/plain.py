"""Model folders read as their users read them, none of obliq's encoder used: an adapter by transformers and
peft (:func:`plain_reader`: ``PeftModel.from_pretrained`` on its base, the adapter's own
``adapter_config.json``, the prefixes and lengths given, a masked mean and L2 normalisation written here), a
sentence-transformers folder by plain ``SentenceTransformer(folder)`` with nothing set afterwards
(:func:`st_reader`: ``encode_query`` / ``encode_document`` at the prompts and lengths the folder carries).

``obliq export`` checks the folders it writes with them (:mod:`obliq.commands.export`): against the input adapter read
the same plain way (each text alone, no padding), or a training checkpoint's rebuilt encoder, on probe texts
that include one longer than both lengths (:func:`probe_texts`), so a folder that reads past them (or short of
them) differs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from obliq.aliases import resolve_model

PROBE = [
    "A passage in the same restless, aphoristic voice as this one.",
    "The witness declined to answer and turned the question back on the committee.",
    "Find problems solved by the pigeonhole principle.",
    "Tweets that quietly oppose the policy without naming it.",
    "The court adjourned; nobody expected the verdict, least of all the defendant's lawyers.",
    "Short.",
]
"""The built-in probe texts (``obliq export --probe_file`` replaces them); :func:`probe_texts` adds a long one."""

KINDS = ("query", "passage")

Reader = Callable[[list[str], str], torch.Tensor]
"""``read(texts, kind)``: (n, d) float32 unit vectors of n texts read as ``kind`` (``query`` / ``passage``)."""


def probe_texts(texts: list[str], tokenizer, lengths: dict[str, int]) -> list[str]:
    """``texts`` and one text longer than every length in ``lengths`` (tokens, by ``tokenizer``): numbered
    sentences of :data:`PROBE`, so its words after any cut differ from those before.
    """
    longest = max(lengths.values())
    sentences, text = [], ""
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= longest + 16:
        start = len(sentences)
        sentences += [f"{i + 1}. {PROBE[i % len(PROBE)]}" for i in range(start, 2 * start + 8)]
        text = " ".join(sentences)
    return list(texts) + [text]


def embeddings(read: Reader, texts: list[str], one_at_a_time: bool = False) -> dict[str, torch.Tensor]:
    """``read``'s vectors of ``texts`` per kind, in one batch or each text alone."""
    if one_at_a_time:
        return {kind: torch.cat([read([t], kind) for t in texts]) for kind in KINDS}
    return {kind: read(texts, kind) for kind in KINDS}


def min_cosine(expect: dict[str, torch.Tensor], read: Reader, texts: list[str], one_at_a_time: bool = True) -> float:
    """The least cosine between ``expect`` and ``read``'s vectors of ``texts`` (both kinds), read in one batch or
    each text alone; NaN vectors give NaN."""
    got = embeddings(read, texts, one_at_a_time)
    return float(torch.cat([(got[k].float() * expect[k].float()).sum(-1) for k in KINDS]).min())


def mean_unit(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``hidden`` (n, L, d) over the tokens ``mask`` (n, L) keeps, L2-normalised: (n, d) float32."""
    m = mask.unsqueeze(-1).to(torch.float32)
    return torch.nn.functional.normalize((hidden.float() * m).sum(1) / m.sum(1), dim=-1)


def plain_reader(
    folder: str | Path,
    base: str | None,
    prefixes: dict[str, str],
    lengths: dict[str, int],
    bidirectional: bool,
    trust_remote_code: bool = False,
) -> Reader:
    """A model folder read with transformers (and peft, for an adapter on ``base``) as the model card tells a
    user to: each text after its kind's prefix, cut at its kind's length, the masked mean of the last hidden
    states, L2-normalised; float32. ``bidirectional``: the decoder's attention made bidirectional as the card
    does (``config.is_causal`` and every attention module's flag). None of obliq's encoder is used.
    """
    from transformers import AutoModel, AutoTokenizer

    source = resolve_model(base) if base is not None else str(folder)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token or tokenizer.unk_token
    model = AutoModel.from_pretrained(source, dtype=torch.float32, trust_remote_code=trust_remote_code)
    if bidirectional:
        model.config.is_causal = False
        for module in model.modules():
            if getattr(module, "is_causal", None) is True:
                module.is_causal = False
    if base is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(folder))
    model.eval()

    @torch.no_grad()
    def read(texts: list[str], kind: str) -> torch.Tensor:
        batch = tokenizer(
            [prefixes[kind] + t for t in texts],
            padding=True,
            truncation=True,
            max_length=lengths[kind],
            return_tensors="pt",
        )
        batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        return mean_unit(model(**batch).last_hidden_state, batch["attention_mask"])

    return read


def st_reader(folder: str | Path):
    """A sentence-transformers folder loaded as a plain user loads it (``SentenceTransformer(folder)``, on the
    CPU, nothing set afterwards) and its reader: ``encode_query`` / ``encode_document`` at the folder's own
    prompts and lengths. Returns ``(model, read)``."""
    from sentence_transformers import SentenceTransformer

    loaded = SentenceTransformer(str(folder), device="cpu")

    def read(texts: list[str], kind: str) -> torch.Tensor:
        encode = loaded.encode_query if kind == "query" else loaded.encode_document
        return encode(texts, convert_to_tensor=True, normalize_embeddings=True).float().cpu()

    return loaded, read


def differences(loaded, encoder, probe: list[str], dtype: torch.dtype) -> list[str]:
    """What makes a sentence-transformers folder read texts otherwise than the adapter: the chat
    template (a ``message`` modality), the prompts, the lengths, the tokens fed to the model, the
    pooling, the attention, the weights' dtype."""
    found = []
    transformer = loaded[0]
    if "message" in (getattr(transformer, "modality_config", None) or {}):
        found.append(
            "sentence_bert_config.json has a 'message' modality: sentence-transformers wraps every text in the "
            "tokenizer's chat template (system prompt included) before encoding"
        )
    for kind, key in (("query", "query"), ("passage", "document")):
        want = encoder.settings[f"{kind}_prefix"]
        if (loaded.prompts or {}).get(key, "") != want:
            found.append(f"the {key!r} prompt is {(loaded.prompts or {}).get(key)!r}, the adapter's prefix {want!r}")
        length = getattr(transformer, f"{key}_length", None) or loaded.max_seq_length
        if length != encoder.text.max_length[kind]:
            found.append(
                f"sentence-transformers reads {key}s at {length} tokens, the adapter at {encoder.text.max_length[kind]}"
            )
    text = encoder.settings["query_prefix"] + probe[0]
    ours = encoder.tokenize([probe[0]], "query")["input_ids"][0].tolist()
    try:
        theirs = loaded.tokenize([text])["input_ids"][0].tolist()
    except Exception as err:  # an API this version lacks: say so rather than guess
        theirs = None
        found.append(f"could not compare tokens ({type(err).__name__})")
    if theirs is not None and theirs != ours:
        tok = encoder.tokenizer
        found.append(
            f"the model is fed other tokens: {tok.decode(theirs)[:120]!r} instead of {tok.decode(ours)[:120]!r}"
        )
    pooling = [m for m in loaded if type(m).__name__ == "Pooling"]
    if not pooling or getattr(pooling[0], "pooling_mode", "mean") != "mean":
        found.append("the pooling is not a mean over the tokens")
    if not any(type(m).__name__ == "Normalize" for m in loaded):
        found.append("the embeddings are not L2-normalised")
    config = getattr(getattr(transformer, "model", None), "config", None)
    if encoder.made_bidirectional and getattr(config, "is_causal", None) is not False:
        found.append("the folder's decoder attends causally (config.is_causal is not False)")
    if dtype != torch.float32:
        found.append(f"the merged weights are stored in {str(dtype).removeprefix('torch.')} (the check is float32)")
    return found
