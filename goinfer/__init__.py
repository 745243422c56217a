"""goinfer: fast CPU inference of open-weight LLMs."""
__version__ = "0.1.0"
