"""tideloop-only: network methods not built yet raise NotImplementedError
naming the method (synchronously, or when the returned coroutine is awaited).
Delete an entry here when its method is implemented."""
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
        "create_connection": (pf, "127.0.0.1", 9),
        "create_server": (pf, "127.0.0.1", 0),
        "create_unix_connection": (pf, "/nonexistent/tideloop.sock"),
        "create_unix_server": (pf, None),
        "create_datagram_endpoint": (lambda: asyncio.DatagramProtocol(),),
        "sock_recv": (a, 10),
        "sock_recv_into": (a, bytearray(10)),
        "sock_sendall": (a, b"x"),
        "sock_connect": (a, ("127.0.0.1", 9)),
        "sock_accept": (a,),
        "sock_sendfile": (a, tmpfile),
        "sendfile": (None, tmpfile),
        "connect_read_pipe": (pf, tmpfile),
        "connect_write_pipe": (pf, tmpfile),
        "subprocess_exec": (asyncio.SubprocessProtocol, "true"),
        "subprocess_shell": (asyncio.SubprocessProtocol, "true"),
        "start_tls": (None, None, None),
        "connect_accepted_socket": (pf, a),
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
