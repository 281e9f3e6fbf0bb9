"""The notebook surface: magics, HTML views, and the IPython extension that loads them."""

from .extension import load_ipython_extension, unload_ipython_extension

__all__ = ["load_ipython_extension", "unload_ipython_extension"]
