"""A `dfpo` command piped into a reader that closes early (`dfpo objectives --long | head -1`) stops quietly."""

import signal
import subprocess
import sys


def test_a_closed_pipe_ends_the_command_quietly_with_the_shells_sigpipe_status():
    """No traceback when the reader of stdout is gone: exit 128 + SIGPIPE, as a shell tool does."""
    code = "import sys; from dfpo.cli import main; sys.exit(main(['objectives', '--long']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write (the import alone takes a second)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
