"""``python -m fakepulumi``: run the stand-in CLI."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
