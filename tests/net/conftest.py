"""The ``tls_route`` and ``streams_path`` fixtures.

The ``tls_route`` fixture: a TLS test runs once on stock asyncio and, on
tideloop, once per route of its C TLS transport (issue 12): "openssl" (OpenSSL's
SSL* driven from C) and "sslobject" (ssl.SSLObject + MemoryBIO driven from C).

A test asks for it with ``pytest.mark.usefixtures("tls_route")`` (or as an
argument); its ``loop_name`` is then parametrised together with the route, ids
``asyncio``, ``tideloop-openssl``, ``tideloop-sslobject``.  The fixture sets
the route with ``tideloop._core.set_tls_route()`` for the test and restores the
previous one afterwards.  A route this build does not offer
(``tideloop._core.tls_routes``) skips with the reason.
"""
import pytest

from tls_helpers import TLS_ROUTES


def _tideloop_routes():
    try:
        from tideloop import _core
    except ImportError:
        return ()  # the loop fixture's own import fails the test
    return TLS_ROUTES


def _params():
    params = [pytest.param("asyncio", None, id="asyncio")]
    routes = _tideloop_routes()
    for route in routes:
        params.append(pytest.param("tideloop", route, id=f"tideloop-{route}"))
    return params




@pytest.fixture
def tls_route(request, loop_name):
    """The route this test runs tideloop's TLS on; None on stock asyncio (and
    on tideloop while the route API does not exist)."""
    route = getattr(request, "param", None)
    if route is None:
        yield None
        return
    from tideloop import _core

    if route not in _core.tls_routes:
        pytest.skip(f"TLS route {route!r} not available here (tls_routes={_core.tls_routes})")
    previous = _core.set_tls_route(route)
    assert _core.tls_route() == route
    try:
        yield route
    finally:
        _core.set_tls_route(previous)


# ---- asyncio streams: the ``streams_path`` fixture ----
# A test that asks for it runs on stock asyncio and on tideloop twice: with
# the C data path of asyncio streams ("c", the default) and with it turned
# off for the test ("python": asyncio's own StreamReader code on tideloop's
# transports).  ids: asyncio, tideloop-c, tideloop-python.

def _streams_params():
    return [pytest.param("asyncio", None, id="asyncio"),
            pytest.param("tideloop", "c", id="tideloop-c"),
            pytest.param("tideloop", "python", id="tideloop-python")]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    # A parametrize mark on the test takes precedence over the loop_name
    # fixture's own params (["asyncio", "tideloop"]), so adding one here, before
    # pytest reads the marks, replaces them with the (loop, route) pairs.
    if "streams_path" in metafunc.fixturenames:
        metafunc.definition.add_marker(pytest.mark.parametrize(
            ("loop_name", "streams_path"), _streams_params(), indirect=["streams_path"]))
    elif "tls_route" in metafunc.fixturenames:
        metafunc.definition.add_marker(pytest.mark.parametrize(
            ("loop_name", "tls_route"), _params(), indirect=["tls_route"]))


@pytest.fixture
def streams_path(request, loop_name):
    """None on stock asyncio; "c" or "python" on tideloop, with
    tideloop._core.set_streams_fast_path() set for the test."""
    path = getattr(request, "param", None)
    if path is None:
        yield None
        return
    from tideloop import _core

    previous = _core.set_streams_fast_path(path == "c")
    try:
        yield path
    finally:
        _core.set_streams_fast_path(previous)
