"""`python -m hvdkeras`: an unmodified script as one worker; bad input exits 2 before anything starts."""

import subprocess
import sys


def test_python_m_hvdkeras_missing_script(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hvdkeras", str(tmp_path / "nope.py")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert "does not exist" in out.stderr
