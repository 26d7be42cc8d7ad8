"""The loop inside an isolated subinterpreter (own GIL), on both loops: each
snippet runs in a fresh process's subinterpreter and must print the same on
stock asyncio and on tideloop.  Transports (TCP, Unix, UDP, pipes,
subprocesses, TLS), streams, sock_*, executors, the refusal of signal
handlers, and tideloop's diagnostics there."""
import subprocess
import sys
import sysconfig

import pytest

from interp_helpers import TESTS, check, needs_subinterpreters, run_in_subinterpreter
from loop_helpers import SLOW, _tideloop_root, child_env

TWO_INTERPRETERS = TESTS / "interpreters" / "two_interpreters.py"
# Stall stacks in a subinterpreter: not on a free-threaded 3.13, where only
# sys._current_frames() may read another thread's frame and walks other
# interpreters' frames there (tideloop._diag_state.STALL_STACKS).
STALL_STACKS_IN_SUBINTERPRETERS = not (sysconfig.get_config_var("Py_GIL_DISABLED")
                                       and sys.version_info < (3, 14))

pytestmark = needs_subinterpreters


def test_tideloop_imports_and_knows_it_is_not_the_main_interpreter(loop_name):
    out = check(run_in_subinterpreter("""
        loop = new_loop()
        print(type(loop).__module__, loop.time() > 0)
        loop.close()
        if LOOP_NAME == "tideloop":
            import tideloop._core as core
            assert core.main_interpreter == 0
    """, loop_name))
    assert out == [("tideloop" if loop_name == "tideloop" else "asyncio.unix_events") + " True"]


def test_tcp_and_unix_streams_echo(loop_name, tmp_path):
    out = check(run_in_subinterpreter(f"""
        async def handle(reader, writer):
            while line := await reader.readline():
                writer.write(line.upper())
                await writer.drain()
            writer.close()

        async def one(server, connect):
            async with server:
                r, w = await connect()
                for word in (b"a", b"bb", b"ccc"):
                    w.write(word + b"\\n")
                    print((await r.readline()).decode().strip())
                w.close()
                await w.wait_closed()

        async def main():
            srv = await asyncio.start_server(handle, "127.0.0.1", 0)
            port = srv.sockets[0].getsockname()[1]
            await one(srv, lambda: asyncio.open_connection("127.0.0.1", port))
            path = {str(tmp_path / "s.sock")!r}
            srv = await asyncio.start_unix_server(handle, path)
            await one(srv, lambda: asyncio.open_unix_connection(path))
        run(main())
    """, loop_name))
    assert out == ["A", "BB", "CCC"] * 2


def test_udp_echo(loop_name):
    out = check(run_in_subinterpreter("""
        class Echo(asyncio.DatagramProtocol):
            def connection_made(self, transport):
                self.transport = transport
            def datagram_received(self, data, addr):
                self.transport.sendto(data * 2, addr)

        class Client(asyncio.DatagramProtocol):
            def __init__(self):
                self.got = asyncio.get_running_loop().create_future()
            def datagram_received(self, data, addr):
                self.got.set_result(data)

        async def main():
            loop = asyncio.get_running_loop()
            st, _ = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
            addr = st.get_extra_info("sockname")
            ct, cp = await loop.create_datagram_endpoint(Client, remote_addr=addr)
            ct.sendto(b"ping")
            print(await asyncio.wait_for(cp.got, 5))
            ct.close(); st.close()
        run(main())
    """, loop_name))
    assert out == ["b'pingping'"]


def test_subprocess_and_pipes(loop_name):
    out = check(run_in_subinterpreter("""
        import os
        async def main():
            p = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read()[::-1])",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            out, _ = await p.communicate(b"olleh")
            print(out.decode(), p.returncode)
            loop = asyncio.get_running_loop()
            r, w = os.pipe()
            reader = asyncio.StreamReader()
            tr, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(r, "rb"))
            os.write(w, b"through a pipe\\n")
            print((await reader.readline()).decode().strip())
            os.close(w)
            tr.close()
        run(main())
    """, loop_name))
    assert out == ["hello 0", "through a pipe"]


def test_tls_echo(loop_name):
    out = check(run_in_subinterpreter("""
        import ssl
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(SERVER_CERT)
        client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client_ctx.load_verify_locations(CA)

        async def handle(reader, writer):
            writer.write((await reader.readline()) * 2)
            await writer.drain()
            writer.close()

        async def main():
            srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
            port = srv.sockets[0].getsockname()[1]
            async with srv:
                r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                     server_hostname="localhost")
                w.write(b"secret\\n")
                print(await r.read(), w.get_extra_info("ssl_object").version().startswith("TLS"))
                w.close()
        run(main())
    """, loop_name))
    assert out == ["b'secret\\nsecret\\n' True"]


def test_sock_ops_and_executor(loop_name):
    out = check(run_in_subinterpreter("""
        import socket, threading
        async def main():
            loop = asyncio.get_running_loop()
            a, b = socket.socketpair()
            a.setblocking(False); b.setblocking(False)
            await loop.sock_sendall(a, b"x" * 100000)
            got = 0
            while got < 100000:
                got += len(await loop.sock_recv(b, 65536))
            print(got)
            name = await loop.run_in_executor(None, lambda: threading.current_thread().name)
            print(name != threading.current_thread().name)
            a.close(); b.close()
        run(main())
    """, loop_name))
    assert out == ["100000", "True"]


def test_signal_handlers_refused_as_the_stock_loop_refuses(loop_name):
    out = check(run_in_subinterpreter("""
        import signal
        loop = new_loop()
        try:
            loop.add_signal_handler(signal.SIGUSR1, print)
        except Exception as exc:
            print(type(exc).__name__, exc)
        print(loop.remove_signal_handler(signal.SIGUSR1))
        loop.close()
    """, loop_name))
    assert out == ["RuntimeError set_wakeup_fd only works in main thread of the main "
                   "interpreter", "False"]


def test_two_interpreters_each_with_a_loop_talk_over_tcp(loop_name):
    # The server's loop in one subinterpreter, the client's in another, at
    # the same time in one process (each run by a thread of the main one).
    proc = subprocess.run([sys.executable, str(TWO_INTERPRETERS), loop_name,
                           str(_tideloop_root())],
                          capture_output=True, text=True, timeout=60 * SLOW, env=child_env())
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    assert proc.stdout.splitlines() == ["client: echoed 200000", "server: 1 connection(s)"]


@pytest.mark.skipif(sys.version_info < (3, 14), reason="InterpreterPoolExecutor: 3.14+")
def test_run_in_executor_with_an_interpreter_pool(new_loop):
    # From the main interpreter: the pool's workers are isolated
    # interpreters; run_in_executor works with them as with threads.
    from concurrent.futures import InterpreterPoolExecutor
    import math
    loop = new_loop()

    async def main():
        with InterpreterPoolExecutor(2) as pool:
            return await asyncio.gather(*(loop.run_in_executor(pool, math.factorial, n)
                                          for n in (5, 10, 20)))
    import asyncio
    assert loop.run_until_complete(main()) == [120, 3628800, 2432902008176640000]
    loop.close()


def test_diagnostics_in_a_subinterpreter():
    # tideloop's own: a stall caught with the blocking line (the watchdog
    # thread attaches to this interpreter, not the main one), the live
    # view's socket named for the interpreter, and answered there.
    out = check(run_in_subinterpreter("""
        import os, time
        import tideloop
        from tideloop import diagnostics, _diag_live

        def block():
            time.sleep(0.3)                       # the blocking line

        async def main():
            diagnostics.watch_stalls(0.05)
            loop = asyncio.get_running_loop()
            loop.call_soon(block)
            await asyncio.sleep(0.5)
            s = diagnostics.stalls()[0]
            print(s["blocked_at"] and s["blocked_at"][2], s["captured_by"])
            path = diagnostics.serve()
            print(os.path.basename(path) != "%d.sock" % os.getpid())
            doc = await asyncio.to_thread(_diag_live.request, path, {"want": "view"})
            print(len(doc["loops"]))
            diagnostics.stop_serving()
        tideloop.run(main())
    """, "tideloop"))
    if STALL_STACKS_IN_SUBINTERPRETERS:
        assert out == ["block gil", "True", "1"]
    else:   # 3.13t: the report says where the step ended, without a stack
        assert out[0].startswith("None ") and out[1:] == ["True", "1"], out
