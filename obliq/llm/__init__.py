"""The language-model layer under synthetic queries and reranking: both stages import it, neither
imports the other.

- :mod:`obliq.llm.backends`: the interface every generator has, the one reading path
  (:func:`~obliq.llm.backends.ask`) and :func:`~obliq.llm.backends.backend_config`, which picks a
  backend's settings by name;
- one module per backend, named as it, holding the backend and its settings: :mod:`obliq.llm.transformers`
  (CPU or GPU), :mod:`obliq.llm.llamacpp` (CPU, GGUF files), :mod:`obliq.llm.vllm` (GPU);
- :mod:`obliq.llm.prompts`: prompt templates kept as data files, their checks, chat messages;
- :mod:`obliq.llm.chat`: a chat turned into the token ids every backend is fed (markers from the
  template, documents as text);
- :mod:`obliq.llm.reply`: a reply read (finished or cut, reasoning removed, an answer or an echo).
"""
