"""Helpers shared by tests and benchmarks (random archives of any geometry).

Names are loaded lazily so ``python -m needle_cy.testing.make_random_archive``
runs the module once (no runpy double-import warning).
"""
__all__ = ["make_random_archive", "random_config", "random_tensors"]


def __getattr__(name):
    if name in __all__:
        from . import make_random_archive as module

        return getattr(module, name)
    raise AttributeError(f"module 'needle_cy.testing' has no attribute {name!r}")
