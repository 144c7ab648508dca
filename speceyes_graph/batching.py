"""Moved to :mod:`speceyes_graph.models.batching`; this name keeps existing imports working."""

from .models.batching import BatchScheduler, BatchStats

__all__ = ["BatchScheduler", "BatchStats"]
