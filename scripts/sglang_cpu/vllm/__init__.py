"""Not vLLM: the one import SGLang's CPU path needs from it (see ``_custom_ops``)."""
