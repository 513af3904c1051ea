"""testbed: an emulated lab for distributed machine-learning networking research."""

__version__ = "0.1.0"
