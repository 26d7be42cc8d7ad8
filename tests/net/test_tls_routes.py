"""The TLS route API of tideloop (issue 12) that the ``tls_route`` fixture
(tests/net/conftest.py) relies on: tideloop._core.set_tls_route(name) returns
the previous route and raises ValueError for a route that is unknown or not
available here; tls_route() is the current one; tls_routes the available
ones."""
import pytest

from tls_helpers import TLS_ROUTES


def test_tls_route_api():
    from tideloop import _core

    routes = _core.tls_routes
    assert isinstance(routes, tuple) and routes
    assert set(routes) <= set(TLS_ROUTES) | {"asyncio"}
    start = _core.tls_route()
    assert start in routes
    try:
        for route in routes:
            before = _core.tls_route()
            assert _core.set_tls_route(route) == before
            assert _core.tls_route() == route
        for bad in ("no-such-route", ""):
            with pytest.raises(ValueError):
                _core.set_tls_route(bad)
            assert _core.tls_route() == routes[-1]  # unchanged
        for unavailable in set(TLS_ROUTES) - set(routes):
            with pytest.raises(ValueError):
                _core.set_tls_route(unavailable)
    finally:
        _core.set_tls_route(start)
    assert _core.tls_route() == start


def test_openssl_route_proven_on_every_tested_interpreter():
    """The openssl route is the fast one; where its import-time proof fails
    every TLS test of that route skips, so a proof broken by a new _ssl
    layout (3.15 moved the SSLEOFError flag) must fail here instead.  The
    matrix's interpreters all link OpenSSL 3.x."""
    import ssl

    from tideloop import _core, _tls

    if ssl.OPENSSL_VERSION_INFO < (3, 0):
        pytest.skip("the openssl route needs OpenSSL 3.0+")
    if _core.portable:      # TIDELOOP_PORTABLE: not tried, and it says why
        assert "TIDELOOP_PORTABLE" in _tls.TLS_ROUTE_PROOF
        assert _core.tls_routes == ("sslobject",)
        return
    assert _tls.TLS_ROUTE_PROOF is None
    assert _core.tls_routes[0] == "openssl"
