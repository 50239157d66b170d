"""The package version, alone, so that modules read it without importing the package face."""

__version__ = "0.1.0"
