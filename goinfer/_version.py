"""goinfer's version (one place: the package and the layout cache's header read it)."""

__version__ = "0.1.0"
