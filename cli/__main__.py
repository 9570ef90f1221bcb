"""``python -m houchu.cli``: the ``houchu`` command."""

from houchu.cli.main import main

raise SystemExit(main())
