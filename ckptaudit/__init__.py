"""ckptaudit: audit every checkpoint of a training run and say where to roll back.

Importing the package is cheap: it pulls in neither torch nor pandas.  Heavy
modules are imported by the functions that need them.
"""

from ._version import __version__

__all__ = ["__version__", "safe_load_checkpoint"]


def __getattr__(name):  # lazy, so `import ckptaudit` stays light for Snakemake rules
    if name == "safe_load_checkpoint":
        from .safe_load import safe_load_checkpoint

        return safe_load_checkpoint
    raise AttributeError(name)
