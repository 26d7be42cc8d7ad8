"""Any asyncio program, unchanged: ``python -m tideloop run examples/hello.py``
runs it on tideloop, ``python examples/hello.py`` on asyncio's own loop."""
import asyncio


async def main():
    await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    print("running on", type(loop).__module__ + "." + type(loop).__qualname__)


asyncio.run(main())
