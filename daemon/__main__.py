import sys

from tessel.daemon.main import main

sys.exit(main())
