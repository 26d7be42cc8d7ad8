"""What every application in this folder does with a request."""
import asyncio
import os
import time


async def serve(block=0.0, sleep=0.0):
    """The answer: the running loop's class (module.qualname) and this
    process's pid.  ``block`` seconds hold the whole process first, as
    CPU-bound work does (while they run, another worker must take the next
    connection); ``sleep`` seconds keep the request in flight (the tests
    stop the server meanwhile).  Each is said on stdout when it starts."""
    if block:
        print(f"held: {os.getpid()}", flush=True)
        time.sleep(block)
    if sleep:
        print(f"in flight: {os.getpid()}", flush=True)
        await asyncio.sleep(sleep)
    cls = type(asyncio.get_running_loop())
    return {"loop": f"{cls.__module__}.{cls.__qualname__}", "pid": os.getpid()}
