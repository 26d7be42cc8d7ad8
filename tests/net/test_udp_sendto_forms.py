"""Every address form a Unix datagram transport's sendto() can be given, run
on the stock selector loop and on tideloop inside one test, outcomes compared.

The stock loop of the running interpreter is the spec, whatever it does: for
an unconnected endpoint made from one end of a socketpair (peer name '',
'unnamed'), every CPython from 3.11 to 3.14 calls socket.sendto(data, None),
a fatal TypeError that closes the transport; tideloop must do the same, and
must deliver the same datagrams, addresses and errors for the other forms
(path as str or bytes, abstract names, autobound peers, connected
endpoints)."""
import asyncio
import os
import socket

import pytest

import tideloop

STEP = 2.0


class Recorder(asyncio.DatagramProtocol):
    def __init__(self):
        self.events = []
        self.lost = asyncio.get_running_loop().create_future()

    def datagram_received(self, data, addr):
        self.events.append(("dgram", data, addr))

    def error_received(self, exc):
        self.events.append(("error", type(exc).__name__, getattr(exc, "errno", None)))

    def connection_lost(self, exc):
        self.events.append(("lost", type(exc).__name__ if exc else None))
        if not self.lost.done():
            self.lost.set_result(None)


def _drain(sock):
    out = []
    while True:
        try:
            data, addr = sock.recvfrom(1 << 16)
        except BlockingIOError:
            return out
        out.append((data, addr))


def _names(tmp_path, tag):
    """Addresses of a named peer in each spelling."""
    path = str(tmp_path / f"peer-{tag}.sock")
    abstract = f"\0tideloop-sendto-{os.getpid()}-{tag}"
    return path, abstract


# Each scenario: (endpoint kind, how the destination is spelled).
SCENARIOS = [
    ("socketpair", "none"),          # sendto(data)
    ("socketpair", "explicit-none"),  # sendto(data, None)
    ("socketpair", "peer-empty"),    # sendto(data, '') -- the peer's name
    ("unbound", "path-str"),
    ("unbound", "path-bytes"),
    ("unbound", "abstract-str"),
    ("unbound", "abstract-bytes"),
    ("unbound", "autobind-peer"),    # the address the kernel gave a peer
    ("unbound", "none"),
    ("unbound", "missing-path"),     # no such socket: error_received
    ("bound", "reply-to-source"),    # answer with what datagram_received got
    ("bound", "reply-to-unnamed"),   # source was unnamed: addr None
    ("connected", "none"),
    ("connected", "same-path"),
    ("connected", "other-path"),     # ValueError from sendto itself
    ("connected-abstract", "none"),
    ("connected-abstract", "same-bytes"),
]


async def _scenario(kind, form, tmp_path, tag):
    loop = asyncio.get_running_loop()
    handler_calls = []
    loop.set_exception_handler(lambda lp, ctx: handler_calls.append(ctx["message"]))
    path, abstract = _names(tmp_path, tag)
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    peer.setblocking(False)
    to_close = [peer]
    result = {}
    try:
        if kind == "socketpair":
            a, peer2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            peer.close()
            peer = peer2
            peer.setblocking(False)
            to_close.append(peer)
            tr, p = await loop.create_datagram_endpoint(Recorder, sock=a)
            peer.send(b"in")
        elif kind in ("unbound",):
            if form == "autobind-peer":
                peer.bind("")
            elif form.startswith("abstract"):
                peer.bind(abstract)
            elif form != "missing-path":
                peer.bind(path)
            tr, p = await loop.create_datagram_endpoint(
                Recorder, family=socket.AF_UNIX)
        elif kind == "bound":
            local = str(tmp_path / f"local-{tag}.sock")
            if form == "reply-to-source":
                peer.bind(path)
            tr, p = await loop.create_datagram_endpoint(
                Recorder, local_addr=local, family=socket.AF_UNIX)
            peer.sendto(b"in", local)
        else:   # connected, connected-abstract
            target = abstract if kind == "connected-abstract" else path
            peer.bind(target)
            tr, p = await loop.create_datagram_endpoint(
                Recorder, remote_addr=target, family=socket.AF_UNIX)
        result["peername"] = tr.get_extra_info("peername")
        await asyncio.sleep(0.02)

        dest = {
            "none": (),
            "explicit-none": (None,),
            "peer-empty": ("",),
            "path-str": (path,),
            "path-bytes": (path.encode(),),
            "abstract-str": (abstract,),
            "abstract-bytes": (abstract.encode(),),
            "autobind-peer": (peer.getsockname() if form == "autobind-peer" else None,),
            "missing-path": (str(tmp_path / f"missing-{tag}.sock"),),
            "same-path": (path,),
            "other-path": (str(tmp_path / "other.sock"),),
            "same-bytes": (abstract.encode(),),
        }
        if form in ("reply-to-source", "reply-to-unnamed"):
            args = (p.events[0][2],) if p.events else ()
        else:
            args = dest[form]
        try:
            tr.sendto(b"out", *args)
            result["raised"] = None
        except Exception as exc:  # the spec decides which, if any
            result["raised"] = (type(exc).__name__, str(exc).replace(str(tmp_path), "TMP"))
        await asyncio.sleep(0.05)
        result["closing"] = tr.is_closing()
        if not tr.is_closing():
            tr.close()
        await asyncio.wait_for(p.lost, STEP)
        received = _drain(peer)

        def norm(x):
            if isinstance(x, str):
                return x.replace(str(tmp_path), "TMP").replace(abstract, "ABSTRACT")
            if isinstance(x, bytes):
                return x.replace(abstract.encode(), b"ABSTRACT")
            return x
        result["events"] = [tuple(norm(v) for v in e) for e in p.events]
        result["peer_received"] = [(d, norm(a) if form != "autobind-peer" else "auto")
                                   for d, a in received]
        result["handler"] = handler_calls
        result["peername"] = norm(result["peername"])
        return result
    finally:
        for s in to_close:
            s.close()


def _run_on(factory, kind, form, tmp_path, tag):
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_scenario(kind, form, tmp_path, tag))


@pytest.mark.parametrize("kind,form", SCENARIOS, ids=[f"{k}-{f}" for k, f in SCENARIOS])
def test_sendto_form_matches_stock(kind, form, tmp_path):
    # Same names on both sides (run one after the other, sockets closed).
    stock = _run_on(asyncio.SelectorEventLoop, kind, form, tmp_path / "s", "n")
    ours = _run_on(tideloop.new_event_loop, kind, form, tmp_path / "t", "n")
    assert ours == stock


@pytest.fixture(autouse=True)
def _dirs(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "t").mkdir()


def test_scenarios_exercise_delivery(tmp_path):
    """The comparison above is not vacuous: on the stock loop most forms do
    deliver a datagram to the peer, and the socketpair one fails."""
    delivered = failed = 0
    for kind, form in SCENARIOS:
        r = _run_on(asyncio.SelectorEventLoop, kind, form, tmp_path / "s", f"x{delivered}{failed}")
        if r["peer_received"]:
            delivered += 1
        if r["handler"] or r["raised"] or any(e[0] == "error" for e in r["events"]):
            failed += 1
    assert delivered >= 9
    assert failed >= 3
