"""The independent reference for NV-Embed's published bidirectional Llama, run as its own process.

    python tests/nemo_reference.py <request.json> <out.pt>

It never imports obliq: the model class is NeMo Automodel's ``LlamaBidirectionalModel`` (PyPI
``nemo-automodel``, installed with ``--no-deps``), which registers ``llama_bidirec`` with transformers'
Auto classes on import — a separate process keeps that registration out of the tests' own. Requests
(``{"do": …}``):

- ``hidden``: ``{"folder", "ids": [[token ids], …]}``: each text alone (no padding), fp32: NeMo's last
  hidden states and its ``avg`` pooling, L2-normalised; and the same from transformers' plain
  ``LlamaModel`` given a full (all-visible) 4D attention mask built here, the second reference.
- ``build``: ``{"base", "adapter_out", "merged_out", "seed"}``: the paper's two layouts built with
  sentence-transformers over NeMo's class and peft: an ST folder whose model is a peft LoRA (r 16, α 32,
  dropout 0.05 on the 7 projections, B drawn from N(0, 0.05)) as ``SentenceTransformer.save`` writes it
  (OBLIQ-IR-3B-LoRA), and the same LoRA merged into the weights (OBLIQ-IR-3B). Prompts ``query: `` /
  ``passage: ``, mean pooling, normalisation, max length 1024 (the model card).
- ``encode``: ``{"folder", "base"?, "queries", "passages"}``: embeddings by plain sentence-transformers
  (its prompts, mean pooling, normalisation; queries at 256 tokens, passages at 1024) of a merged ST
  folder, or of ``base`` with the peft adapter ``folder`` on it.
"""

from __future__ import annotations

import json
import sys

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = {"query": "query: ", "document": "passage: "}


def _nemo():
    from nemo_automodel.components.models.llama_bidirectional import model

    return model


def hidden(folder: str, ids: list[list[int]]) -> dict:
    from transformers import LlamaConfig, LlamaModel

    nemo = _nemo()
    model = nemo.LlamaBidirectionalModel.from_pretrained(folder, dtype=torch.float32).eval()
    published = json.load(open(f"{folder}/config.json"))
    keep = {k: v for k, v in published.items() if k not in ("architectures", "auto_map", "model_type", "pooling")}
    plain = LlamaModel.from_pretrained(folder, config=LlamaConfig(**keep), dtype=torch.float32).eval()
    out = {"nemo_hidden": [], "nemo_pooled": [], "llama_hidden": [], "llama_pooled": []}
    with torch.no_grad():
        for row in ids:
            x = torch.tensor([row])
            mask = torch.ones_like(x)
            h = model(input_ids=x, attention_mask=mask).last_hidden_state
            out["nemo_hidden"].append(h[0])
            out["nemo_pooled"].append(torch.nn.functional.normalize(nemo._pool(h, mask, "avg"), dim=-1)[0])
            full = torch.zeros(1, 1, len(row), len(row))  # every token sees every token: bidirectional
            h = plain(input_ids=x, attention_mask=full).last_hidden_state
            out["llama_hidden"].append(h[0])
            out["llama_pooled"].append(torch.nn.functional.normalize(h.mean(dim=1), dim=-1)[0])
    return out


def _st(base: str):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    _nemo()
    # plain text in (the card's prefixes, never the tokenizer's chat template: sentence-transformers 6 would add a
    # "message" modality for a tokenizer that has one and wrap every text in it)
    text_only = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
    transformer = Transformer(
        base,
        max_seq_length=1024,
        modality_config=text_only,
        module_output_name="token_embeddings",
        model_kwargs={"dtype": torch.float32},  # fp32 as the comparison (the published config says bfloat16)
    )
    width = transformer.model.config.hidden_size
    return SentenceTransformer(
        modules=[transformer, Pooling(width, "mean"), Normalize()], prompts=PROMPTS, device="cpu"
    )


def build(base: str, adapter_out: str, merged_out: str, seed: int) -> dict:
    from peft import LoraConfig, get_peft_model

    st = _st(base)
    transformer = st[0]
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=TARGETS)
    transformer.model = get_peft_model(transformer.model, lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in transformer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    st.save(adapter_out)
    transformer.model = transformer.model.merge_and_unload()
    # NeMo's config keeps `temperature` outside its dataclass fields, which transformers 5 refuses to save as
    # a generation parameter; the published config.json has no such field either
    del transformer.model.config.temperature
    st.save(merged_out)
    return {}


def encode(folder: str, queries: list[str], passages: list[str], base: str | None = None) -> dict:
    from sentence_transformers import SentenceTransformer

    if base is None:
        _nemo()
        st = SentenceTransformer(folder, device="cpu", model_kwargs={"dtype": torch.float32})
    else:
        from peft import PeftModel

        st = _st(base)
        st[0].model = PeftModel.from_pretrained(st[0].model, folder)
    st.max_seq_length = 256
    q = st.encode_query(queries, convert_to_tensor=True, normalize_embeddings=True)
    st.max_seq_length = 1024
    d = st.encode_document(passages, convert_to_tensor=True, normalize_embeddings=True)
    return {"queries": q.float(), "passages": d.float(), "prompts": st.prompts}


if __name__ == "__main__":
    request = json.load(open(sys.argv[1]))
    do = {"hidden": hidden, "build": build, "encode": encode}[request.pop("do")]
    torch.save(do(**request), sys.argv[2])
