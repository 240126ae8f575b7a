"""qtune: measure, tune and deploy LLM inference servers."""

__version__ = "0.1.0"
