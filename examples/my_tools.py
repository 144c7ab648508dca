"""A user-defined tool, referenced from my_toolset.toml as ``my_tools:brightness``."""

from typing import Annotated

import numpy as np
from langchain_core.tools import tool
from langgraph.prebuilt import InjectedState

from speceyes_tools import default_store


@tool
def brightness(state: Annotated[dict, InjectedState]) -> str:
    """Mean brightness (0-255) of the query's first image."""
    image = default_store().get(state["images"][0])
    return f"mean brightness {float(np.mean(image)):.1f}"
