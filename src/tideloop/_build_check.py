"""Refuse to import an unbuilt checkout with a message that says so.

``tideloop._core`` is a C extension; its sources live in the directory of the
same name (``src/tideloop/_core/``).  Without the built extension for the
running interpreter, ``import tideloop._core`` would find that directory and
import it as an empty namespace package, and the first use of the core would
fail far from the cause (an AttributeError on a missing C function).  This
module runs first, before anything touches ``_core``.
"""
import importlib.util

_spec = importlib.util.find_spec(__package__ + "._core")
# The extension is a module, never a package: a spec with search locations is
# the source directory taken for a namespace package.
if _spec is None or _spec.submodule_search_locations is not None:
    raise ImportError(
        "tideloop: the extension is not built: run pip install . "
        "(in a checkout used in place: python setup.py build_ext --inplace)",
        name=__package__ + "._core")
del _spec
