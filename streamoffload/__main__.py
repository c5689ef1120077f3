import sys

from streamoffload.cli import main

sys.exit(main())
