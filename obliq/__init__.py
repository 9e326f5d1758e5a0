"""obliq: train, evaluate and audit dense retrievers for oblique queries."""

__version__ = "0.1.0"
