"""Model backends: local checkpoints, served models, and scripted stand-ins.

- :class:`ChatTransformersVLM` (:mod:`.chat_transformers`): any Hugging Face
  image-text-to-text checkpoint as a LangChain chat model, batched across concurrent calls by
  a :class:`BatchScheduler` (:mod:`.batching`); messages are converted in :mod:`.conversion`.
- :func:`openai_models`, :func:`openai_chat_model` (:mod:`.openai_compat`): vLLM / SGLang
  servers through ``langchain-openai``.
- :class:`ScriptedChatModel`, :func:`fake_logprobs` (:mod:`.scripted`): deterministic
  stand-ins for tests and the offline example.

torch and transformers are imported when a ``ChatTransformersVLM`` is first built.
"""

from .batching import BatchScheduler, BatchStats
from .chat_transformers import ChatTransformersVLM
from .conversion import to_hf_messages
from .openai_compat import openai_chat_model, openai_models
from .scripted import ScriptedChatModel, fake_logprobs

__all__ = [
    "BatchScheduler",
    "BatchStats",
    "ChatTransformersVLM",
    "ScriptedChatModel",
    "fake_logprobs",
    "openai_chat_model",
    "openai_models",
    "to_hf_messages",
]
