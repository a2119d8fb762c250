import sys

from vime.cli.main import main

sys.exit(main())
