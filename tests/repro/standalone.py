"""Run a reproducer the way a kernel engineer would: a fresh ``python -I`` without adaptcheck.

adaptcheck is installed (editable) in the test environment, so ``-I`` alone would still let
a script import it. The wrapper first blocks every import of adaptcheck, reference_kernels
and tests (a meta-path finder that raises), proves the block works, then runs the script as
``__main__``: a script that needs adaptcheck fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BLOCKED = ("adaptcheck", "reference_kernels", "tests")

_WRAPPER = """
import runpy, sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked for this test: ' + name)
        return None
sys.meta_path.insert(0, _Block())
try:
    import adaptcheck
except ImportError:
    pass
else:
    raise SystemExit('adaptcheck is importable: the block failed')
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name='__main__')
"""


def run_standalone(script: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``script`` isolated (``python -I``, cwd = its folder, adaptcheck blocked)."""
    return subprocess.run([sys.executable, "-I", "-c", _WRAPPER.format(blocked=BLOCKED), str(script), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=script.parent, check=False)


def adaptcheck_blocked() -> bool:
    """The wrapper's premise, checked: under it, ``import adaptcheck`` fails."""
    probe = subprocess.run([sys.executable, "-I", "-c", _WRAPPER.format(blocked=BLOCKED).split("script =")[0]],
                           capture_output=True, text=True, timeout=60, check=False)
    return probe.returncode == 0
