"""The failover experiment: `python tests/ha/run.py --jobs 10000 --out DIR`.

See tests/ha/README.md for the scenarios and what each run checks.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script: make the repository importable (tests.ha.*).
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.ha.experiment import main

    sys.exit(main())
