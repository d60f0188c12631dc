"""Run one fault scenario: `python tests/faults/run.py --scenario kill9 --jobs 60 --out DIR`.

See tests/faults/README.md for the scenarios and what each run checks.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script: make the repository importable (tests.faults.*).
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.faults.harness import main

    sys.exit(main())
