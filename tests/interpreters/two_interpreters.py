"""A TCP server's loop in one isolated interpreter and its client's loop in
another, at the same time in one process (tests/interpreters/
test_in_subinterpreter.py runs it: python two_interpreters.py LOOP ROOT)."""
import socket
import sys
import threading

try:
    from concurrent import interpreters as ci
except ImportError:                 # 3.13
    ci = None
    import _interpreters


def spawn(code):
    """Run code in a new isolated interpreter from a thread; returns a join()
    that waits, destroys it and raises what the code raised."""
    failed = []
    if ci is not None:
        interp = ci.create()

        def body():
            try:
                interp.exec(code)
            except ci.ExecutionFailed as exc:
                failed.append(exc.excinfo.errdisplay)
        destroy = interp.close
    else:
        interp = _interpreters.create("isolated")

        def body():
            info = _interpreters.exec(interp, code)
            if info is not None:
                failed.append(info.errdisplay)

        def destroy():
            _interpreters.destroy(interp)
    thread = threading.Thread(target=body)
    thread.start()

    def join():
        thread.join()
        destroy()
        if failed:
            raise RuntimeError(failed[0])
    return join


PREAMBLE = """\
import sys
sys.path.insert(0, {root!r})
import asyncio, socket
def new_loop():
    if {loop_name!r} == "asyncio":
        return asyncio.SelectorEventLoop()
    import tideloop
    return tideloop.new_event_loop()
"""

SERVER = """
async def main():
    seen = 0
    done = asyncio.Event()
    async def handle(r, w):
        nonlocal seen
        seen += 1
        while data := await r.read(1000):
            w.write(data)
        w.close()
        done.set()
    sock = socket.socket(fileno=socket.dup({fd}))
    srv = await asyncio.start_server(handle, sock=sock)
    async with srv:
        await asyncio.wait_for(done.wait(), 30)
    print("server:", seen, "connection(s)", flush=True)
loop = new_loop()
loop.run_until_complete(main())
loop.close()
"""

CLIENT = """
async def main():
    r, w = await asyncio.open_connection("127.0.0.1", {port})
    total = 0
    for i in range(200):
        w.write(b"y" * 1000)
        total += len(await r.readexactly(1000))
    print("client: echoed", total, flush=True)
    w.close()
    await w.wait_closed()
loop = new_loop()
loop.run_until_complete(main())
loop.close()
"""


def main(loop_name, root):
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    pre = PREAMBLE.format(root=root, loop_name=loop_name)
    server = spawn(pre + SERVER.format(fd=lsock.fileno()))
    client = spawn(pre + CLIENT.format(port=lsock.getsockname()[1]))
    client()
    server()
    lsock.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
