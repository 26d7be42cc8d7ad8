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
