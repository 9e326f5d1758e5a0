"""Synthetic training queries (the OBLIQ-IR paper, §3.1 and Appendix J).

- :mod:`obliq.synth.prompts`: Stage A / Stage B prompt files (``prompts/*.yaml``, one per stage and
  lens) and :class:`TaskSpec`, a task's lens and attribute wording (from ``configs/synth/``);
- :mod:`obliq.synth.backends`: generators behind one interface: transformers (CPU/GPU, default
  SmolLM2-135M-Instruct) and vLLM (GPU, optional extra ``gen``);
- :mod:`obliq.synth.parse`: replies → description or query, or a reason to retry;
- :mod:`obliq.synth.generate`: sampling, Stage A then B with retries, resumable append-only rows, report;
- :mod:`obliq.synth.audit`: entity leaks, token Jaccard and BM25 rank of generated vs real queries;
- :mod:`obliq.synth.commands`: the ``obliq synth generate`` and ``obliq synth audit`` commands.
"""

from obliq.synth.generate import GenerationConfig, SynthReport, sample_documents, synthesize
from obliq.synth.parse import Parsed, parse_reply
from obliq.synth.prompts import LENSES, TaskSpec, load_prompt, render

__all__ = ["GenerationConfig", "LENSES", "Parsed", "SynthReport", "TaskSpec", "load_prompt", "parse_reply", "render",
           "sample_documents", "synthesize"]
