"""pytest plugin: run a project's async tests on tideloop (or uvloop).

    pytest --loop=tideloop              # or in the ini file: tideloop_loop = tideloop

Registered as the ``tideloop`` entry point of ``pytest11``, so it is loaded
wherever tideloop is installed; with the default, ``asyncio``, it registers
nothing and changes nothing (it only adds a line to the report header).
Otherwise the chosen loop is supplied to the async test plugins that are
active:

pytest-asyncio >= 1.4
    its ``pytest_asyncio_loop_factories`` hook returns ``{"tideloop":
    tideloop.new_event_loop}``: every ``@pytest.mark.asyncio`` test and
    every async ``@pytest_asyncio.fixture`` runs in an ``asyncio.Runner``
    made with that factory (test ids do not change: with one factory
    pytest-asyncio hides the parameter, on pytest >= 8.4).  The hook is
    ``trylast``: a ``pytest_asyncio_loop_factories`` of the project's own
    (conftest) is asked first and its mapping wins.  An older pytest-asyncio
    (no such hook) is a usage error rather than a silent stock loop.
anyio >= 4.0
    the default ``anyio_backend`` fixture is replaced by one with the same
    params (the available backends) and ids, whose ``asyncio`` param becomes
    ``("asyncio", {"loop_factory": tideloop.new_event_loop})``; trio stays
    trio.  An ``anyio_backend`` of the project's own (fixture in a conftest,
    test module or class, or ``@pytest.mark.parametrize("anyio_backend",
    ...)``) takes precedence, as it does over anyio's default: to run such
    tests on tideloop, return ``("asyncio", {"loop_factory":
    tideloop.new_event_loop})`` from it.

The option is also spelled ``--tideloop-loop``; ``--loop`` is added only when
no initial conftest or other plugin already defines an option of that name.
Precedence: the command line, then the ini option, then ``asyncio``.
``-p no:tideloop`` keeps the plugin out altogether.  Loading it imports the
tideloop package (the entry point's module lives in it).
"""
import sys
import types

import pytest

LOOPS = ("asyncio", "tideloop", "uvloop")
DEFAULT = "asyncio"
INI = "tideloop_loop"
_DEST = "tideloop_loop"
_GROUP = "tideloop"
_HELP = ("event loop for async tests under pytest-asyncio and anyio: "
         "asyncio (default: the stock loop, the plugin changes nothing), "
         "tideloop or uvloop")

_state_key = pytest.StashKey()
_short_key = pytest.StashKey()     # whether --loop is this plugin's


def pytest_addoption(parser):
    group = parser.getgroup(_GROUP, "tideloop: the event loop of async tests")
    group.addoption("--tideloop-loop", dest=_DEST, choices=LOOPS, default=None,
                    metavar="LOOP", help=_HELP + " (same as --loop)")
    parser.addini(INI, help="default for --loop / --tideloop-loop: " + _HELP,
                  default="")


def _option_defined(parser, name):
    groups = [getattr(parser, "_anonymous", None), *getattr(parser, "_groups", ())]
    for group in groups:
        for option in getattr(group, "options", ()):
            if name in option.names():
                return True
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # The short --loop is added once the initial conftests have added their
    # options: a project whose conftest has a --loop of its own keeps it
    # (two options of one name make argparse refuse the command line) and
    # reaches this plugin through --tideloop-loop or the ini option.
    yield
    free = not _option_defined(parser, "--loop")
    if free:
        parser.getgroup(_GROUP).addoption(
            "--loop", dest=_DEST, choices=LOOPS, default=None, metavar="LOOP",
            help=_HELP)
    early_config.stash[_short_key] = free


def _chosen(config):
    name = config.getoption(_DEST, default=None)
    if name is not None:
        return name, "command line"
    name = (config.getini(INI) or "").strip()
    if not name:
        return DEFAULT, "default"
    if name not in LOOPS:
        raise pytest.UsageError(
            f"ini option {INI} = {name!r}: expected one of {', '.join(LOOPS)}")
    return name, f"ini option {INI}"


def _factory(name):
    try:
        if name == "tideloop":
            import tideloop
            return tideloop.new_event_loop
        import uvloop
        return uvloop.new_event_loop
    except ImportError as exc:
        raise pytest.UsageError(f"--loop={name}: cannot import {name}: {exc}") from exc


def _active_plugin(config, module_name):
    module = sys.modules.get(module_name)
    return module is not None and config.pluginmanager.is_registered(module)


def _version(dist):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return "?"


class _AsyncioLoopFactories:
    """pytest-asyncio's hook, registered only when a loop is chosen."""

    def __init__(self, name, factory):
        self._factories = {name: factory}

    @pytest.hookimpl(trylast=True)
    def pytest_asyncio_loop_factories(self, config, item):
        return dict(self._factories)


def _anyio_params():
    # The params of anyio's own anyio_backend fixture (the available
    # backends since anyio 4.12, all of them before), so that ids and the
    # set of backends stay as they are without this plugin.
    from anyio import pytest_plugin as anyio_plugin
    fixture = getattr(anyio_plugin, "anyio_backend", None)
    for attr in ("_fixture_function_marker", "_pytestfixturefunction"):
        params = getattr(getattr(fixture, attr, None), "params", None)
        if params:
            return list(params)
    try:
        from anyio import get_available_backends
    except ImportError:
        from anyio._core._eventloop import get_all_backends as get_available_backends
    return list(get_available_backends())


def _with_loop(backend, factory):
    if backend == "asyncio":
        return "asyncio", {"loop_factory": factory}
    if (isinstance(backend, tuple) and len(backend) == 2 and backend[0] == "asyncio"
            and isinstance(backend[1], dict) and "loop_factory" not in backend[1]):
        return "asyncio", {**backend[1], "loop_factory": factory}
    return backend


def _anyio_plugin(factory):
    # A plugin module of its own, registered after anyio's entry point: of
    # two location-less (plugin) fixtures pytest uses the one registered
    # last, and any conftest, module or class fixture overrides both.
    @pytest.fixture(scope="module", params=_anyio_params())
    def anyio_backend(request):
        return _with_loop(request.param, factory)

    module = types.ModuleType(__name__ + "._anyio")
    module.anyio_backend = anyio_backend
    return module


def pytest_configure(config):
    name, source = _chosen(config)
    state = {"loop": name, "source": source, "via": []}
    config.stash[_state_key] = state
    if name == DEFAULT:
        return
    factory = _factory(name)
    if _active_plugin(config, "pytest_asyncio.plugin"):
        if not hasattr(config.hook, "pytest_asyncio_loop_factories"):
            raise pytest.UsageError(
                f"--loop={name} needs pytest-asyncio >= 1.4 (its "
                f"pytest_asyncio_loop_factories hook); installed: "
                f"{_version('pytest-asyncio')}")
        config.pluginmanager.register(_AsyncioLoopFactories(name, factory),
                                      "tideloop-pytest-asyncio")
        state["via"].append(f"pytest-asyncio {_version('pytest-asyncio')}")
    if _active_plugin(config, "anyio.pytest_plugin"):
        config.pluginmanager.register(_anyio_plugin(factory), "tideloop-anyio")
        state["via"].append(f"anyio {_version('anyio')}")


def pytest_report_header(config):
    state = config.stash.get(_state_key, None)
    if state is None:
        return None
    if state["loop"] == DEFAULT:
        line = f"tideloop: loop=asyncio (the stock loop; {state['source']})"
    elif state["via"]:
        line = (f"tideloop: loop={state['loop']} ({state['source']}) "
                f"under {', '.join(state['via'])}")
    else:
        line = (f"tideloop: loop={state['loop']} ({state['source']}), but no "
                f"async test plugin (pytest-asyncio, anyio) is active")
    if not config.stash.get(_short_key, True):
        line += "; --loop is another plugin's or conftest's: use --tideloop-loop"
    return line
