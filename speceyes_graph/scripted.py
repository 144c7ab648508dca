"""Moved to :mod:`speceyes_graph.models.scripted`; this name keeps existing imports working."""

from .models.scripted import ScriptedChatModel, fake_logprobs

__all__ = ["ScriptedChatModel", "fake_logprobs"]
