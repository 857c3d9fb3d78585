"""``python -m grading``: grade every lab (see :mod:`grading.run.cli`)."""

import sys

from grading.run.cli import main

sys.exit(main())
