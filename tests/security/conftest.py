"""The ZAP tests' peer processes, closed after each test."""
import pytest

from zap_helpers import ZapPeer


@pytest.fixture
def peers(tmp_path):
    started = []

    def start(role, endpoint, *, server=None, client=None, plain=False, source=None):
        argv = [role, "--endpoint", endpoint]
        if not plain:
            # --opt=KEY: a Z85 key may start with "-", which argparse would
            # take for an option.
            argv += [f"--serverkey={server}"]
            if client:
                argv += [f"--public={client[0]}", f"--secret={client[1]}"]
        if source:
            argv += ["--source", source]
        p = ZapPeer(*argv, cwd=str(tmp_path))
        started.append(p)
        p.expect("ready")
        return p

    yield start
    for p in started:
        p.close()
