"""Smoke test of an installed tideloop wheel (run by tools/wheels.py).

    python -I -W error wheel_smoke.py CERTS_DIR

Run from a directory outside the checkout, in a venv that holds the wheel
and nothing else of ours: it checks that tideloop and its extension come from
that venv's site-packages, that the wheel's metadata and package data are
there, then runs one small program on tideloop's loop: a timer
(call_later), a TCP echo (start_server / open_connection), a subprocess
with a pipe, and a TLS echo on each TLS route of the engine (certificates
from CERTS_DIR: ca.pem, server-ecdsa.pem).  Prints one line ``smoke: ok
...`` and exits 0, or raises (any warning is an error under -W error).
"""
import asyncio
import importlib.metadata
import importlib.resources
import os
import ssl
import sys
import sysconfig

PAYLOAD = b"tideloop wheel smoke\n" * 64


def check_install():
    import tideloop
    import tideloop._core as core
    site = os.path.realpath(sysconfig.get_paths()["platlib"])
    for mod in (tideloop, core):
        path = os.path.realpath(mod.__file__)
        assert path.startswith(site + os.sep), f"{mod.__name__} from {path}, not from {site}"
    version = importlib.metadata.version("tideloop")
    assert tideloop.__version__ == version, (tideloop.__version__, version)
    files = importlib.resources.files("tideloop")
    for name in ("py.typed", "__init__.pyi"):
        assert files.joinpath(name).is_file(), f"{name} is not installed"
    return tideloop, core


async def echo_handler(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


async def echo_round(ssl_server=None, ssl_client=None):
    server = await asyncio.start_server(echo_handler, "127.0.0.1", 0, ssl=ssl_server)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ssl_client,
            server_hostname="localhost" if ssl_client else None)
        writer.write(PAYLOAD)
        await writer.drain()
        got = await reader.readexactly(len(PAYLOAD))
        assert got == PAYLOAD, "echo mismatch"
        version = writer.get_extra_info("ssl_object").version() if ssl_client else None
        writer.close()
        await writer.wait_closed()
        return version
    finally:
        server.close()
        await server.wait_closed()


async def main(core, certs):
    loop = asyncio.get_running_loop()
    assert type(loop).__module__.startswith("tideloop"), type(loop)

    fired = loop.create_future()
    t0 = loop.time()
    loop.call_later(0.02, fired.set_result, "fired")
    assert await asyncio.wait_for(fired, 5) == "fired"
    assert loop.time() - t0 >= 0.015, loop.time() - t0

    await asyncio.wait_for(echo_round(), 10)

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", "import sys; sys.stdout.write(sys.stdin.read()[::-1])",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(b"looped"), 30)
    assert (proc.returncode, out) == (0, b"depool"), (proc.returncode, out)

    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(os.path.join(certs, "server-ecdsa.pem"))
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(os.path.join(certs, "ca.pem"))
    tls = {}
    for route in core.tls_routes:
        core.set_tls_route(route)
        tls[route] = await asyncio.wait_for(echo_round(server_ctx, client_ctx), 10)
    assert tls, "no TLS route"
    return tls


def smoke(certs):
    tideloop, core = check_install()
    tls = tideloop.run(main(core, certs))
    routes = ", ".join(f"{r} {v}" for r, v in tls.items())
    build = sys.version.split()[0]
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        gil = getattr(sys, "_is_gil_enabled", lambda: True)()
        if gil:
            raise SystemExit("smoke: FAILED: the GIL is on after import tideloop")
        build += "t (GIL off)"
    return (f"smoke: ok: tideloop {tideloop.__version__} on {build}: "
            f"timer, tcp echo, subprocess, tls ({routes})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: wheel_smoke.py CERTS_DIR")
    print(smoke(sys.argv[1]), flush=True)
