"""tokenwire: the Codec binary token-streaming protocol for Python, and an LLM gateway."""

__version__ = "0.1.0"
