"""``python -m speceyes_graph.cli``: the ``speceyes`` command."""

from . import main

raise SystemExit(main())
