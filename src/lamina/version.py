"""lamina's version: a leaf, so that any layer may record it without importing the package."""

__version__ = "0.1.0"
