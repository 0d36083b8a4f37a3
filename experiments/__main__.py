import sys

from experiments.cli.main import main

sys.exit(main())
