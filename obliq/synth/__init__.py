"""Synthetic training queries (the OBLIQ-IR paper, §3.1 and Appendix J).

- :mod:`obliq.synth.prompts`: Stage A / Stage B prompt files (``prompts/*.yaml``, one per stage and
  lens) and :class:`TaskSpec`, a task's lens and attribute wording (from ``configs/synth/``);
- :mod:`obliq.synth.parse`: replies → description or query, or a reason to retry;
- :mod:`obliq.synth.generate`: sampling, Stage A then B (optionally few-shot, from the development side)
  with retries, best-of-n samples per document, resumable append-only rows, report with the cost;
- :mod:`obliq.synth.fewshot`: the few-shot examples of Stage B, drawn from the development side;
- :mod:`obliq.synth.audit`: entity leaks, token Jaccard and BM25 rank of generated vs real queries;
- :mod:`obliq.synth.filter`: those measures as decisions, thresholds from the real development queries;
- :mod:`obliq.commands.synth`: the ``obliq synth generate / merge / audit / filter`` commands.

The generators themselves (transformers on CPU or GPU, vLLM on GPU) are the LLM layer's
(:mod:`obliq.llm.backends`), shared with reranking.
"""

from obliq.synth.fewshot import FewShotConfig
from obliq.synth.filter import FilterConfig, filter_candidates
from obliq.synth.generate import GenerationConfig, SynthReport, sample_documents, synthesize
from obliq.synth.parse import ParsedReply, parse_reply
from obliq.synth.prompts import LENSES, TaskSpec, load_stage_prompt, render_stage

__all__ = [
    "FewShotConfig",
    "FilterConfig",
    "GenerationConfig",
    "LENSES",
    "ParsedReply",
    "SynthReport",
    "TaskSpec",
    "load_stage_prompt",
    "parse_reply",
    "filter_candidates",
    "render_stage",
    "sample_documents",
    "synthesize",
]
