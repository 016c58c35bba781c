import sys

from bench.faults.run import main

sys.exit(main())
