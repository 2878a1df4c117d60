"""``python -m needle_cy`` — the same as the ``needle-cy`` command."""
import sys

from .cli import main

sys.exit(main())
