"""The language-model layer under synthetic queries and reranking: both stages import it, neither
imports the other.

- :mod:`obliq.llm.backends`: generators behind one interface (transformers on CPU or GPU, vLLM on
  GPU) and :class:`~obliq.llm.backends.BackendConfig`, the settings that build one;
- :mod:`obliq.llm.prompts`: prompt templates kept as data files, their checks, chat messages;
- :mod:`obliq.llm.chat`: a chat turned into the token ids both backends are fed (markers from the
  template, documents as text).
"""
