import sys

from distill.cli import main

sys.exit(main())
