import sys

from iattention.cli import main

sys.exit(main())
