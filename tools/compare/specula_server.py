"""`specula serve` for the comparison scripts beside this file: started on a free loopback port,
waited for until /health answers, ended when the `with` block leaves."""
import contextlib
import socket
import subprocess
import time

import httpx


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(specula, args, model=None):
    """Yields (url, the server's pid) for `specula serve ARGS` (and --model MODEL when given)."""
    port = free_port()
    cmd = [specula, "serve", "--port", str(port), *args]
    if model:
        cmd += ["--model", model]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield url, srv.pid
    finally:
        srv.terminate()
        srv.wait(timeout=60)
