import sys

from bench.gpu.run import main

sys.exit(main())
