"""Packages whose names load on first use (so that importing the package imports no torch): ``lazy_package``."""

import importlib
import sys
import types

__all__ = ["lazy_package"]


class _LazyPackage(types.ModuleType):
    """A package whose lazy names are never replaced by a submodule of the same name (generate.py's ``generate``,
    run.py's ``run``): the import system sets ``package.<submodule>`` after importing one, which would hide the name
    from ``__getattr__``."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and name in self.__dict__.get("_lazy_homes", {}):
            return
        super().__setattr__(name, value)

    def __getattr__(self, name):
        homes = self.__dict__["_lazy_homes"]
        if name not in homes:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        module = importlib.import_module(homes[name], self.__name__)
        for lazy, home in homes.items():
            if home == homes[name]:
                self.__dict__[lazy] = getattr(module, lazy)
        return self.__dict__[name]

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.__dict__["_lazy_homes"]))


def lazy_package(name: str, homes: dict) -> None:
    """Package ``name`` (call it from its __init__ with ``__name__``) gets ``homes`` ({attribute: ".submodule"}) on
    first use."""
    package = sys.modules[name]
    package._lazy_homes = dict(homes)
    package.__class__ = _LazyPackage
