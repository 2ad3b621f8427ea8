"""``python -m blendrag.cli``: the ``blendrag`` command."""

import sys

from blendrag.cli import main

sys.exit(main())
