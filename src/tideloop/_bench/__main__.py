import sys

from .micro import main

sys.exit(main(prog="python -m tideloop._bench", invocation=("-m", "tideloop._bench")))
