"""tideloop-only: methods not built yet raise NotImplementedError naming the
method (synchronously, or when the returned coroutine is awaited).
Delete an entry here when its method is implemented.

TCP/Unix stream networking (issue #3) and TLS are implemented: their
behaviour is tested on both loops in test_tcp_*.py, test_unix_*.py,
test_server.py, test_sock_ops.py, test_sendfile.py and test_streams.py.
What remains is UDP, pipes and subprocesses."""
import asyncio
import inspect
import os
import socket
import tempfile

import pytest


class Proto(asyncio.Protocol):
    pass


@pytest.fixture
def tl_loop():
    import tideloop

    lp = tideloop.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture
def socks():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _calls(a, b, tmpfile):
    pf = Proto
    return {
        "create_datagram_endpoint": (lambda: asyncio.DatagramProtocol(),),
        "connect_read_pipe": (pf, tmpfile),
        "connect_write_pipe": (pf, tmpfile),
        "subprocess_exec": (asyncio.SubprocessProtocol, "true"),
        "subprocess_shell": (asyncio.SubprocessProtocol, "true"),
    }


METHODS = list(_calls(None, None, None))


@pytest.mark.parametrize("name", METHODS)
def test_tideloop_not_implemented(tl_loop, socks, name):
    a, b = socks
    with tempfile.TemporaryFile() as f:
        f.write(b"data")
        f.seek(0)
        args = _calls(a, b, f)[name]
        with pytest.raises(NotImplementedError, match=rf"\b{name}\b"):
            res = getattr(tl_loop, name)(*args)
            if inspect.isawaitable(res):
                tl_loop.run_until_complete(res)
        # the loop is still fine afterwards
        assert tl_loop.run_until_complete(asyncio.sleep(0, result=1)) == 1
