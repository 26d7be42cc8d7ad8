"""tideloop.diagnostics' public names stay where users import them from,
whichever of its modules (_diag_state, _diag_tasks, _diag_live, _diag_otel)
defines them.  (That those modules import no circle is
tests/tooling/test_layering.py's check.)"""


def test_the_public_names_stay_where_they_were():
    from tideloop import diagnostics
    for name in diagnostics.__all__:
        assert hasattr(diagnostics, name), name
    for name in ("snapshot", "stalls", "slow_callbacks", "subscribe", "task_leaks",
                 "report_task_leaks", "top_tasks", "OpenTelemetryMetrics", "serve", "loops",
                 "summary", "diff", "logger", "HISTOGRAM_BOUNDS", "PrometheusCollector"):
        assert name in diagnostics.__all__
