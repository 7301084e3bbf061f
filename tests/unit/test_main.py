"""`python -m hvdkeras`: an unmodified script as one worker; bad input exits 2 before anything starts."""

import subprocess
import sys


def test_python_m_hvdkeras_missing_script(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hvdkeras", str(tmp_path / "nope.py")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert "does not exist" in out.stderr


def test_python_m_hvdkeras_passes_hvdkeras_write_wait_to_the_wrap(monkeypatch, tmp_path):
    """The settings are read once where the worker starts, and the wait goes to the wrap from there."""
    import hvdkeras
    from hvdkeras import __main__ as entry
    from hvdkeras import settings, wrap

    seen = {}
    monkeypatch.setattr(hvdkeras, "init", lambda: None)
    monkeypatch.setattr(wrap, "install", lambda options, write_wait: seen.update(wait=write_wait))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() sets them for the script
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("HVDKERAS_WRITE_WAIT", "7.5")
    script = tmp_path / "script.py"
    script.write_text("")
    assert entry.main([str(script)]) == 0
    assert seen == {"wait": 7.5} and settings.current().write_wait == 7.5
