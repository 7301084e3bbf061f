"""hvdkeras.basics: Horovod's build queries and its timeline, through hvdkeras."""

import pytest


def test_build_queries_report_this_build(hvd):
    assert hvd.gloo_built() is True and hvd.mpi_built() is False  # built with Gloo only (install_horovod.sh)
    assert hvd.nccl_built() is False and hvd.cuda_built() is False and hvd.rocm_built() is False
    assert hvd.gloo_enabled() is True and hvd.mpi_enabled() is False and hvd.mpi_threads_supported() is False


def test_timeline_writes_horovods_timeline_file(hvd, tmp_path):
    """As in Horovod, start_timeline needs HOROVOD_TIMELINE=DYNAMIC when Horovod starts (this process has not)."""
    import os
    import subprocess
    import sys

    with pytest.raises(ValueError, match="HOROVOD_TIMELINE=DYNAMIC"):
        hvd.start_timeline(str(tmp_path / "no.json"))
    path = tmp_path / "timeline.json"
    code = ("import sys, hvdkeras as hvd; hvd.init(); hvd.start_timeline(sys.argv[1]); "
            "hvd.allreduce([1.0, 2.0], name='timeline.probe'); hvd.stop_timeline()")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HOROVOD_TIMELINE="DYNAMIC"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = path.read_text()
    assert text.lstrip().startswith("[") and "HorovodAllreduce" in text and "GLOO_ALLREDUCE" in text
