"""An HTTP server written with anyio alone (its TCP listener, task group,
worker threads and signal receiver), run by anyio.run on the loop that
argv[1] names; SIGTERM stops it cleanly.

    python anyio_app.py tideloop|asyncio PORT
"""
import asyncio
import json
import signal
import sys
import threading

import anyio

from served import serve


async def handle(client):
    async with client:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await client.receive()
        answer = await serve()
        answer["thread"] = await anyio.to_thread.run_sync(
            lambda: threading.current_thread() is not threading.main_thread())
        body = json.dumps(answer).encode()
        await client.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                          % (len(body), body))


async def main(port):
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, handle)
            async for signum in signals:
                print("stopping on", signal.Signals(signum).name, flush=True)
                tg.cancel_scope.cancel()
                break
    await listener.aclose()


if __name__ == "__main__":
    if sys.argv[1] == "tideloop":
        import tideloop
        factory = tideloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    anyio.run(main, int(sys.argv[2]), backend="asyncio",
              backend_options={"loop_factory": factory})
