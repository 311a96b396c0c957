import sys

from exporter.main import main

sys.exit(main())
