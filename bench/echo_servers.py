#!/usr/bin/env python3
"""Echo servers for the network benchmark, one per asyncio API, on any loop.

    python -m bench.echo_servers --loop asyncio|uvloop|tideloop \\
        --kind protocol|buffered|streams|sockets|tls-protocol|tls-streams \\
        --port P [--unix PATH] [--cert PEM]

Listens on 127.0.0.1:P (P 0 picks a free port) or on the Unix socket PATH,
prints "READY <port>" (or "READY <path>") on stdout once listening, and serves
until killed (SIGTERM).  Every kind echoes what it reads, as soon as it reads it:

* protocol  -- asyncio.Protocol: data_received(data) -> transport.write(data)
* buffered  -- asyncio.BufferedProtocol: get_buffer() returns a memoryview of a
               preallocated 256 KiB bytearray, buffer_updated(n) writes the
               slice view[:n] (no copy in Python)
* streams   -- asyncio.start_server: data = await reader.read(65536);
               writer.write(data); await writer.drain()
* sockets   -- a listening socket + loop.sock_accept, one task per connection:
               data = await loop.sock_recv(sock, 65536);
               await loop.sock_sendall(sock, data); TCP_NODELAY on accepted sockets
               (the transports of the other kinds set it themselves)
* tls-protocol -- protocol over TLS: loop.create_server(..., ssl=context)
* tls-streams  -- streams over TLS: asyncio.start_server(..., ssl=context)

The TLS kinds' context: ssl.SSLContext(PROTOCOL_TLS_SERVER), TLS 1.3 at the
least, the certificate chain and key from --cert (default
tests/certs/server-ecdsa.pem; tests/certs/server-rsa.pem is the RSA one);
everything else is the ssl module's defaults.  The TLS itself is whatever the
loop does for ssl= (asyncio's SSLProtocol on asyncio and, for now, tideloop;
uvloop's own).

The loop is chosen with asyncio.Runner(loop_factory=...) (harness.run_on_loop
in src/tideloop/_bench/): asyncio is the stock asyncio.SelectorEventLoop,
uvloop is uvloop.new_event_loop, tideloop is tideloop.new_event_loop (import
it from the checkout with PYTHONPATH=src).

Any failure before "READY" (an ImportError, NotImplementedError from a loop
that lacks the API, a bind error) exits with status 1 and a one-line reason on
stderr ("echo_servers: ERROR: ..."), after the traceback.
"""

import asyncio
import os
import socket
import ssl

from tideloop._bench import harness

KINDS = ("protocol", "buffered", "streams", "sockets", "tls-protocol", "tls-streams")
CERT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "tests", "certs", "server-ecdsa.pem")
LOOPS = harness.ALL_LOOPS
READ_SIZE = 65536
BUFFER_SIZE = 256 * 1024


# -- protocol ---------------------------------------------------------------

class EchoProtocol(asyncio.Protocol):
    transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)

    def connection_lost(self, exc):
        self.transport = None


# -- buffered ---------------------------------------------------------------

class EchoBufferedProtocol(asyncio.BufferedProtocol):
    transport = None

    def connection_made(self, transport):
        self.transport = transport
        self.view = memoryview(bytearray(BUFFER_SIZE))

    def get_buffer(self, sizehint):
        return self.view

    def buffer_updated(self, nbytes):
        transport = self.transport
        transport.write(self.view[:nbytes])
        if transport.get_write_buffer_size():
            # The transport kept part of the slice queued: some transports
            # (uvloop, CPython >= 3.12) hold on to the memoryview instead of
            # copying it, so the next read must not go into the same memory.
            self.view = memoryview(bytearray(BUFFER_SIZE))

    def connection_lost(self, exc):
        self.transport = None


# -- servers ----------------------------------------------------------------

def server_context(cert):
    """The TLS kinds' server context: TLS 1.3, the ssl module's defaults."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert)
    return context


async def serve_protocol(loop, kind, host, port, unix, context=None):
    factory = EchoBufferedProtocol if kind == "buffered" else EchoProtocol
    if unix:
        server = await loop.create_unix_server(factory, unix, ssl=context)
    else:
        server = await loop.create_server(factory, host, port, ssl=context)
    return server, server.sockets[0].getsockname()


async def echo_stream(reader, writer):
    try:
        while True:
            data = await reader.read(READ_SIZE)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def serve_streams(loop, host, port, unix, context=None):
    if unix:
        server = await asyncio.start_unix_server(echo_stream, unix, ssl=context)
    else:
        server = await asyncio.start_server(echo_stream, host, port, ssl=context)
    return server, server.sockets[0].getsockname()


async def echo_socket(loop, sock):
    recv = loop.sock_recv
    sendall = loop.sock_sendall
    try:
        while True:
            data = await recv(sock, READ_SIZE)
            if not data:
                break
            await sendall(sock, data)
    except ConnectionError:
        pass
    finally:
        sock.close()


async def accept_sockets(loop, lsock, tasks):
    tcp = lsock.family != socket.AF_UNIX
    while True:
        sock, _ = await loop.sock_accept(lsock)
        sock.setblocking(False)
        if tcp:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = loop.create_task(echo_socket(loop, sock))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def serve_sockets(loop, host, port, unix):
    if unix:
        try:
            os.unlink(unix)
        except FileNotFoundError:
            pass
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(unix)
    else:
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((host, port))
    lsock.listen(1024)
    lsock.setblocking(False)
    tasks = set()
    acceptor = loop.create_task(accept_sockets(loop, lsock, tasks))
    return (lsock, acceptor, tasks), lsock.getsockname()


async def main(args):
    loop = asyncio.get_running_loop()
    context = server_context(args.cert) if args.kind.startswith("tls-") else None
    if args.kind in ("protocol", "buffered", "tls-protocol"):
        keep, where = await serve_protocol(loop, args.kind, args.host, args.port, args.unix,
                                           context)
    elif args.kind in ("streams", "tls-streams"):
        keep, where = await serve_streams(loop, args.host, args.port, args.unix, context)
    else:
        keep, where = await serve_sockets(loop, args.host, args.port, args.unix)
        acceptor = keep[1]
        await asyncio.sleep(0)          # let sock_accept start (and fail early)
        if acceptor.done():
            acceptor.result()
    if isinstance(where, tuple):
        where = where[1]
    print(f"READY {where}", flush=True)
    if args.kind == "sockets":
        await keep[1]                   # raises if accepting fails later
    else:
        await asyncio.Future()          # serve until killed


def build_parser():
    p = harness.worker_parser(__doc__, LOOPS, KINDS, port_help="TCP port on --host "
                              "(0: a free one, printed after READY)")
    p.add_argument("--unix", default=None, metavar="PATH",
                   help="listen on this Unix socket instead of TCP")
    p.add_argument("--cert", default=CERT, metavar="PEM",
                   help="the TLS kinds' certificate chain and key (default: %(default)s)")
    return p


if __name__ == "__main__":
    args = build_parser().parse_args()
    harness.worker_main("echo_servers", lambda: harness.run_on_loop(args.loop, main, args))
