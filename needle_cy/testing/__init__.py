"""Helpers shared by tests and benchmarks (random archives of any geometry)."""
import warnings

# ``python -m needle_cy.testing.make_random_archive`` imports this package first,
# which already imports the module; runpy then warns that it is in sys.modules.
# Harmless here (the module has no import-time side effects), so silence exactly that.
warnings.filterwarnings("ignore", message=r".*'needle_cy\.testing\.make_random_archive' found in sys\.modules",
                        category=RuntimeWarning)

from .make_random_archive import make_random_archive, random_config, random_tensors  # noqa: E402

__all__ = ["make_random_archive", "random_config", "random_tensors"]
