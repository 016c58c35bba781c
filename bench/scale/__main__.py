import sys

from bench.scale.run import main

sys.exit(main())
