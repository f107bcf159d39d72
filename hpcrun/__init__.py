"""hpcrun: plan and run large data-processing campaigns on Slurm HPC systems."""

__version__ = "0.1.0"

# The Python API (hpcrun/api.py), loaded on first use so that `hpcrun --version` and the CLI's
# start stay light: `hpcrun.make_plan(...)`, `hpcrun.status(...)` ... (PEP 562).
_API = ("Error", "Validation", "PlanResult", "SubmitResult", "Status", "RetryResult", "Report", "IotuneResults",
        "validate", "make_plan", "open_plan", "submit", "status", "retry", "campaign_report", "outputs",
        "forecast", "iotune_results")


def __getattr__(name: str) -> object:
    if name in _API:
        from hpcrun import api  # the one upward reference, allowed by tests/test_layers.py
        return getattr(api, name)
    raise AttributeError(f"module 'hpcrun' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(list(globals()) + list(_API))
