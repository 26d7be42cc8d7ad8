"""Stand-in loops for validating the conformance runner without the C core.

    python tests/conformance/run.py --loop both --loop-factory standin:StandinLoop
    python tests/conformance/run.py --loop both --loop-factory standin:NYILoop

StandinLoop is the stock loop under another name: every test should pass on
both sides, i.e. zero regressions. NYILoop raises NotImplementedError from
the network/subprocess/pipe methods, as tideloop.Loop does until those issues
land: those tests must show up in the "nyi" column, not as regressions.
"""

import asyncio


class StandinLoop(asyncio.SelectorEventLoop):
    pass


def _nyi(name):
    async def method(self, *args, **kwargs):
        raise NotImplementedError(f"tideloop: {name} is not implemented yet")
    method.__name__ = name
    return method


class NYILoop(asyncio.SelectorEventLoop):
    for _name in ("create_connection", "create_server", "create_unix_connection",
                  "create_unix_server", "create_datagram_endpoint",
                  "connect_accepted_socket", "sock_recv", "sock_recv_into",
                  "sock_sendall", "sock_connect", "sock_accept", "sock_sendfile",
                  "sendfile", "start_tls", "subprocess_exec", "subprocess_shell",
                  "connect_read_pipe", "connect_write_pipe"):
        locals()[_name] = _nyi(_name)
    del _name
