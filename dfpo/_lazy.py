"""Lazy attributes of a package (PEP 562), shared by ``dfpo/__init__`` and ``dfpo/trainer/__init__``.

A public name is imported from the module that defines it on first use, a sub-package on first attribute
access, and either is then stored in the package's namespace (later lookups do not come back here).
Standard library only: importing a package that uses it imports nothing heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_attributes(
    namespace: dict,
    lazy: Mapping[str, str],
    submodules: tuple[str, ...],
    computed: Mapping[str, Callable[[], object]] | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``lazy`` maps a public name to its module, ``submodules``
    are reachable as attributes, ``computed`` maps a name to a function giving its value (``__version__``)."""
    package, computed = namespace["__name__"], computed or {}

    def __getattr__(name: str) -> object:
        if name in computed:
            value = computed[name]()
        elif name in lazy:
            value = getattr(importlib.import_module(lazy[name]), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value  # resolved once
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace["__all__"], *submodules})

    return __getattr__, __dir__
