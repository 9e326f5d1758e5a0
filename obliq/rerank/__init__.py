"""LLM reranking of the dense top-N, per task (the OBLIQ-IR paper, §3.4, §5 "When language-model
reranking helps", §6.3-6.4): TourRank (Chen et al. 2024) and a task-aware listwise reranker, chosen
per task by a policy file (the paper's π*).

- :mod:`obliq.rerank.config`: the policy file (which reranker per task, and their settings).
- :mod:`obliq.rerank.tourrank`: tournaments of group selections, points summed over Y tournaments.
- :mod:`obliq.rerank.listwise`: sliding-window permutations with a prompt that names the latent attribute.
- :mod:`obliq.rerank.prompts`: the prompt files (``prompts/tourrank.yaml``, ``prompts/listwise_<task>.yaml``).
- :mod:`obliq.rerank.parse`: tolerant parsing of selections and permutations, with counted repairs.
- :mod:`obliq.rerank.judge`: sends prompts to the backend, falls back on failure, counts the cost.
- :mod:`obliq.rerank.reranker`: applies a policy to runs (used by ``evaluate.py --rerank``).
- :mod:`obliq.commands.rerank`: ``obliq rerank run`` and ``obliq rerank policy``.
"""
