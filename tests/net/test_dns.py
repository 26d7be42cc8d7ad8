"""getaddrinfo / getnameinfo must give exactly socket's results (no network)."""
import socket

import pytest

CASES = [
    ("127.0.0.1", 80, {}),
    ("127.0.0.1", "80", {}),
    ("127.0.0.1", 0, {"type": socket.SOCK_STREAM}),
    ("127.0.0.1", 8080, {"family": socket.AF_INET, "type": socket.SOCK_DGRAM}),
    ("localhost", 80, {}),
    ("localhost", 443, {"family": socket.AF_INET}),
    ("::1", 80, {}),
    ("::1", 53, {"type": socket.SOCK_DGRAM}),
    (None, 80, {}),
    (None, 0, {"flags": socket.AI_PASSIVE, "type": socket.SOCK_STREAM}),
    ("127.0.0.1", "http", {}),
    ("localhost", "https", {"type": socket.SOCK_STREAM}),
    ("127.0.0.1", None, {}),
    ("127.0.0.1", 80, {"proto": socket.IPPROTO_TCP}),
    ("127.0.0.1", 80, {"flags": socket.AI_NUMERICHOST}),
    (b"127.0.0.1", b"80", {}),
]


def _expected(host, port, kw):
    try:
        return ("ok", socket.getaddrinfo(host, port, **kw))
    except OSError as e:
        return ("err", type(e), e.args)


@pytest.mark.parametrize("host,port,kw", CASES, ids=[f"{h}-{p}-{sorted(k)}" for h, p, k in CASES])
def test_getaddrinfo_matches_socket(loop, host, port, kw):
    want = _expected(host, port, kw)
    try:
        got = ("ok", loop.run_until_complete(loop.getaddrinfo(host, port, **kw)))
    except OSError as e:
        got = ("err", type(e), e.args)
    assert got == want


def test_getaddrinfo_errors_match_socket(loop):
    # a non-numeric host with AI_NUMERICHOST fails without any lookup
    kw = {"flags": socket.AI_NUMERICHOST}
    with pytest.raises(socket.gaierror) as want:
        socket.getaddrinfo("not-a-number.invalid", 80, **kw)
    with pytest.raises(socket.gaierror) as got:
        loop.run_until_complete(loop.getaddrinfo("not-a-number.invalid", 80, **kw))
    assert got.value.args == want.value.args
    with pytest.raises(OSError):
        loop.run_until_complete(loop.getaddrinfo("127.0.0.1", "no-such-service-xyz"))


def test_getaddrinfo_is_a_coroutine(loop):
    aw = loop.getaddrinfo("127.0.0.1", 80)
    assert hasattr(aw, "__await__")
    loop.run_until_complete(aw)


@pytest.mark.parametrize("sockaddr,flags", [
    (("127.0.0.1", 80), socket.NI_NUMERICHOST | socket.NI_NUMERICSERV),
    (("127.0.0.1", 80), socket.NI_NUMERICHOST),
    (("::1", 443, 0, 0), socket.NI_NUMERICHOST | socket.NI_NUMERICSERV),
    (("127.0.0.1", 53), socket.NI_NUMERICHOST | socket.NI_DGRAM),
])
def test_getnameinfo_matches_socket(loop, sockaddr, flags):
    try:
        want = ("ok", socket.getnameinfo(sockaddr, flags))
    except OSError as e:
        want = ("err", type(e), e.args)
    try:
        got = ("ok", loop.run_until_complete(loop.getnameinfo(sockaddr, flags)))
    except OSError as e:
        got = ("err", type(e), e.args)
    assert got == want


def test_getnameinfo_default_flags(loop):
    sockaddr = ("127.0.0.1", 80)
    assert loop.run_until_complete(loop.getnameinfo(sockaddr)) == socket.getnameinfo(sockaddr, 0)
