"""`python -m tessel.coordinator --port 0`: see tessel.coordinator.cli."""

import sys

from tessel.coordinator.cli import main

sys.exit(main())
