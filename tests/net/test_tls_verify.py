"""TLS certificate checks (issue 12): a hostname mismatch and an untrusted CA
fail create_connection() with the same ssl.SSLCertVerificationError (code,
message, reason) as the stock loop; a server that requires a client
certificate (TLS 1.3 and 1.2), with and without one; post-handshake client
authentication; what the accepting side sees of a failed handshake."""
import asyncio
import ssl

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, fd_leak_check, open_fds, wait, wait_until,
)
from tls_helpers import CLIENT, client_context, handler_calls, server_context

pytestmark = pytest.mark.usefixtures("tls_route")

CLIENT_SUBJECT = ((("commonName", "tideloop test client"),),)


async def tls_server(loop, factory, ctx=None):
    srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=ctx or server_context())
    return srv, srv.sockets[0].getsockname()


def recording_factory(loop, accepted):
    def factory():
        p = Recorder(loop, on_data=lambda p, d: p.transport.write(d))
        accepted.append(p)
        return p
    return factory


async def expect_verify_error(loop, addr, ctx, **kw):
    with pytest.raises(ssl.SSLCertVerificationError) as ei:
        await wait(loop.create_connection(lambda: Recorder(loop), *addr, ssl=ctx, **kw))
    return ei.value


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3],
                         ids=["TLSv1.2", "TLSv1.3"])
def test_hostname_mismatch(loop, version):
    before = open_fds()

    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv, addr = await tls_server(loop, recording_factory(loop, accepted))
        exc = await expect_verify_error(loop, addr, client_context(max_version=version),
                                        server_hostname="example.com")
        assert exc.verify_code == 62  # X509_V_ERR_HOSTNAME_MISMATCH
        assert exc.verify_message == "Hostname mismatch, certificate is not valid for 'example.com'."
        assert exc.reason == "CERTIFICATE_VERIFY_FAILED" and exc.library == "SSL"
        assert str(exc).startswith(
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, "
            "certificate is not valid for 'example.com'. (_ssl.c:")
        # The server made a protocol for the connection, but its handshake
        # failed on the client's alert: no connection_made(), no
        # connection_lost(), no exception-handler call on either side.
        await wait_until(lambda: accepted)
        await asyncio.sleep(0.05)
        assert [p.events for p in accepted] == [[]]
        assert calls == []
        await close_server(srv)

    arun(loop, main())
    fd_leak_check(before)


def test_ip_address_mismatch(loop):
    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        exc = await expect_verify_error(loop, addr, client_context(), server_hostname="127.0.0.2")
        assert exc.verify_code == 64  # X509_V_ERR_IP_ADDRESS_MISMATCH
        assert exc.verify_message == "IP address mismatch, certificate is not valid for '127.0.0.2'."
        await close_server(srv)

    arun(loop, main())


def test_host_is_the_default_server_hostname(loop):
    """Without server_hostname the host argument is checked (127.0.0.1 is in
    the certificate's subjectAltName)."""
    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        tr, pr = await wait(loop.create_connection(lambda: Recorder(loop), *addr,
                                                   ssl=client_context()))
        assert tr.get_extra_info("ssl_object").server_hostname == "127.0.0.1"
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("how", ["own-context", "ssl=True"])
def test_untrusted_ca(loop, how):
    before = open_fds()

    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv, addr = await tls_server(loop, recording_factory(loop, accepted))
        ctx = client_context(trust=False) if how == "own-context" else True
        exc = await expect_verify_error(loop, addr, ctx, server_hostname="localhost")
        assert exc.verify_code == 20  # X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY
        assert exc.verify_message == "unable to get local issuer certificate"
        assert exc.reason == "CERTIFICATE_VERIFY_FAILED"
        await wait_until(lambda: accepted)
        await asyncio.sleep(0.05)
        assert [p.events for p in accepted] == [[]]
        assert calls == []
        await close_server(srv)

    arun(loop, main())
    fd_leak_check(before)


def test_no_verification(loop):
    """CERT_NONE and no hostname check: an untrusted server is accepted."""
    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        ctx = client_context(trust=False)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        tr, pr = await wait(loop.create_connection(lambda: Recorder(loop), *addr, ssl=ctx,
                                                   server_hostname="example.com"))
        # not verified: the decoded certificate is not available, the DER is
        assert tr.get_extra_info("peercert") == {}
        assert tr.get_extra_info("ssl_object").getpeercert(True)
        tr.write(b"x")
        assert await pr.wait_bytes(1) == b"x"
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


# ------------------------------------------------------- client certificates

def test_client_certificate_required_and_given(loop):
    async def main():
        accepted = []
        sctx = server_context(client_ca=True, verify_mode=ssl.CERT_REQUIRED)
        srv, addr = await tls_server(loop, recording_factory(loop, accepted), sctx)
        tr, pr = await wait(loop.create_connection(
            lambda: Recorder(loop), *addr, ssl=client_context(cert=CLIENT),
            server_hostname="localhost"))
        tr.write(b"hi")
        assert await pr.wait_bytes(2) == b"hi"
        peercert = accepted[0].transport.get_extra_info("peercert")
        assert peercert["subject"] == CLIENT_SUBJECT
        assert peercert["issuer"] == ((("commonName", "tideloop test CA"),),)
        tr.close()
        assert await wait(pr.lost) is None
        assert await wait(accepted[0].lost) is None
        await close_server(srv)

    arun(loop, main())


# asyncio's SSLProtocol closes the socket at once when the server's handshake
# fails: the alert OpenSSL wrote for the client is never sent.  The client
# sees a plain end of the connection, not the alert.

def test_client_certificate_required_tls13_none_given(loop):
    """TLS 1.3: the client finishes its handshake before the server checks
    its (missing) certificate, so create_connection() succeeds; the server's
    handshake fails and it drops the connection without its alert: the
    client gets eof_received() and connection_lost(None), as for a peer that
    closed.  The server's protocol never sees connection_made(); no
    exception-handler call on either side."""
    before = open_fds()

    async def main():
        calls = handler_calls(loop)
        accepted = []
        sctx = server_context(client_ca=True, verify_mode=ssl.CERT_REQUIRED)
        srv, addr = await tls_server(loop, recording_factory(loop, accepted), sctx)
        tr, pr = await wait(loop.create_connection(
            lambda: Recorder(loop), *addr, ssl=client_context(), server_hostname="localhost"))
        assert pr.events == ["made"]
        assert await wait(pr.lost) is None
        assert pr.events == ["made", "eof", "lost"]
        assert tr.is_closing()
        tr.write(b"dropped")  # no error
        tr.close()
        await asyncio.sleep(0.05)
        assert [p.events for p in accepted] == [[]]
        assert calls == []
        await close_server(srv)

    arun(loop, main())
    fd_leak_check(before)


def test_client_certificate_required_tls12_none_given(loop):
    """TLS 1.2: the server fails the handshake before the client's ends; the
    client's create_connection() gets ConnectionResetError (no alert)."""
    async def main():
        calls = handler_calls(loop)
        accepted = []
        sctx = server_context(client_ca=True, verify_mode=ssl.CERT_REQUIRED)
        srv, addr = await tls_server(loop, recording_factory(loop, accepted), sctx)
        with pytest.raises(ConnectionResetError) as ei:
            await wait(loop.create_connection(
                lambda: Recorder(loop), *addr,
                ssl=client_context(max_version=ssl.TLSVersion.TLSv1_2),
                server_hostname="localhost"))
        assert type(ei.value) is ConnectionResetError and ei.value.args == ()
        await asyncio.sleep(0.05)
        assert [p.events for p in accepted] == [[]]
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_client_certificate_untrusted_by_server(loop):
    """A client certificate the server cannot verify (it trusts no CA): as
    with no certificate, the TLS 1.3 client sees a plain close."""
    async def main():
        calls = handler_calls(loop)
        accepted = []
        sctx = server_context(verify_mode=ssl.CERT_REQUIRED)  # no CA loaded
        srv, addr = await tls_server(loop, recording_factory(loop, accepted), sctx)
        tr, pr = await wait(loop.create_connection(
            lambda: Recorder(loop), *addr, ssl=client_context(cert=CLIENT),
            server_hostname="localhost"))
        assert await wait(pr.lost) is None
        assert pr.events == ["made", "eof", "lost"]
        await asyncio.sleep(0.05)
        assert [p.events for p in accepted] == [[]]
        assert calls == []
        tr.close()
        await close_server(srv)

    arun(loop, main())


def test_client_certificate_optional(loop):
    """CERT_OPTIONAL: without a certificate the server's peercert is None;
    with one, it is decoded."""
    async def main():
        accepted = []
        sctx = server_context(client_ca=True, verify_mode=ssl.CERT_OPTIONAL)
        srv, addr = await tls_server(loop, recording_factory(loop, accepted), sctx)
        for cert, subject in ((None, None), (CLIENT, CLIENT_SUBJECT)):
            tr, pr = await wait(loop.create_connection(
                lambda: Recorder(loop), *addr, ssl=client_context(cert=cert),
                server_hostname="localhost"))
            tr.write(b"?")
            await pr.wait_bytes(1)
            peercert = accepted[-1].transport.get_extra_info("peercert")
            assert (peercert and peercert["subject"]) == subject
            tr.close()
            await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_post_handshake_auth(loop):
    """TLS 1.3 post-handshake authentication: the server asks for the
    client's certificate after the handshake (verify_client_post_handshake()
    on its ssl_object, sent with its next write); the client answers while
    reading; the server sees the certificate after its next read."""
    async def main():
        events = []
        done = loop.create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, tr):
                self.tr = tr
                obj = tr.get_extra_info("ssl_object")
                events.append(("peercert at start", obj.getpeercert()))
                obj.verify_client_post_handshake()
                tr.write(b"hello")

            def data_received(self, data):
                obj = self.tr.get_extra_info("ssl_object")
                events.append((data, obj.getpeercert()["subject"]))
                self.tr.write(data.upper())
                if not done.done():
                    done.set_result(None)

        sctx = server_context(client_ca=True, verify_mode=ssl.CERT_OPTIONAL)
        sctx.post_handshake_auth = True  # no request in the handshake itself
        srv, addr = await tls_server(loop, Server, sctx)
        cctx = client_context(cert=CLIENT)
        cctx.post_handshake_auth = True
        tr, pr = await wait(loop.create_connection(lambda: Recorder(loop), *addr, ssl=cctx,
                                                   server_hostname="localhost"))
        assert await pr.wait_bytes(5) == b"hello"
        tr.write(b"abc")
        await wait(done)
        assert await pr.wait_bytes(8) == b"helloABC"
        assert events == [("peercert at start", None), (b"abc", CLIENT_SUBJECT)]
        tr.close()
        assert await wait(pr.lost) is None
        await close_server(srv)

    arun(loop, main())


def test_post_handshake_auth_refused_by_client(loop):
    """The client did not enable post_handshake_auth: the server's request
    fails at once with the SSLError OpenSSL gives; the connection stays up."""
    async def main():
        errors = []

        class Server(asyncio.Protocol):
            def connection_made(self, tr):
                self.tr = tr
                try:
                    tr.get_extra_info("ssl_object").verify_client_post_handshake()
                except ssl.SSLError as e:
                    errors.append(e.reason)
                tr.write(b"still up")

        sctx = server_context(client_ca=True, verify_mode=ssl.CERT_OPTIONAL)
        srv, addr = await tls_server(loop, Server, sctx)
        tr, pr = await wait(loop.create_connection(
            lambda: Recorder(loop), *addr, ssl=client_context(cert=CLIENT),
            server_hostname="localhost"))
        assert await pr.wait_bytes(8) == b"still up"
        assert errors == ["EXTENSION_NOT_RECEIVED"]
        tr.close()
        assert await wait(pr.lost) is None
        await close_server(srv)

    arun(loop, main())
