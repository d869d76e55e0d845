import sys

from fedrun.cli import main

sys.exit(main())
