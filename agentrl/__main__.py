import sys

from agentrl.cli import main

sys.exit(main())
