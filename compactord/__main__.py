import sys

from compactord.cli import main

sys.exit(main())
