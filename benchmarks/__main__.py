"""``python -m benchmarks``: run the suite (see :mod:`benchmarks.run`)."""

from .run import main

raise SystemExit(main())
