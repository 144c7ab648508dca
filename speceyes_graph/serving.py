"""Moved to :mod:`speceyes_graph.models.openai_compat`; this name keeps existing imports working."""

from .models.openai_compat import openai_chat_model, openai_models

__all__ = ["openai_chat_model", "openai_models"]
