"""The retry policy of a campaign spec: per failure class, whether to retry, how often, what to change.

The classes, how a job's end is classed and their defaults are in hpcrun/model/failures.py (no pydantic, so that
the commands that only decide from the manifest start without these models); this module validates the spec.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field, create_model

from hpcrun.model.failures import (  # noqa: F401  (the others re-exported: named here before failures.py)
    CLASS_NAMES,
    EXIT_CLASSES,
    FAILURE_CLASSES,
    KILL_SIGNALS,
    STATE_CLASSES,
    FailureClass,
    classify,
    default_rules,
)
from hpcrun.model.fields import Command, Duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RetryRule(_Strict):
    """What to do after one class of failure; unset keys keep the class's default."""

    retry: Optional[bool] = Field(None, description="retry at all (false: park at once with the reason)")
    max_attempts: Optional[int] = Field(None, ge=1, description=(
        "failures of this class a job may have before it is parked (default: the class's, else retry.max_attempts)"))
    more_walltime: Optional[float] = Field(None, ge=1.0, description=(
        "multiply the job's time limit by this on each retry, up to the partition's maximum"))
    more_memory: Optional[float] = Field(None, ge=1.0, description=(
        "multiply the job's memory (what it asked, or used) by this on each retry, up to a node's memory"))
    exclude_node: Optional[bool] = Field(None, description="keep the retry off the node(s) the job failed on")
    restage: Optional[bool] = Field(None, description=(
        "stage the inputs again (a resubmitted job always stages anew; recorded as the change)"))


def _rules_model() -> Any:
    fields: Dict[str, Any] = {c.name: (Optional[RetryRule], Field(None, description=c.cause))
                              for c in FAILURE_CLASSES}
    return create_model("RetryRules", __base__=_Strict, __doc__="Per failure class: overrides of the defaults.",
                        **fields)


RetryRules = _rules_model()


class RetrySpec(_Strict):
    """How failures are retried (by ``hpcrun run`` and ``hpcrun retry``) before jobs are parked for a human."""

    max_attempts: int = Field(3, ge=1, description=(
        "failures of one class a job may have before it is parked, for classes without their own limit"))
    max_total_attempts: int = Field(10, ge=1, description="submissions per job in all, over every class")
    cancelled: bool = Field(False, description=(
        "also retry jobs the campaign's operators cancelled with `hpcrun cancel` (their decision, so not "
        "retried by default); cancellations by anyone else are the site_cancel class, retried"))
    on: RetryRules = Field(default_factory=RetryRules, description=(  # type: ignore[valid-type]
        f"per failure class ({', '.join(CLASS_NAMES)}): retry, max_attempts, more_walltime, more_memory, "
        "exclude_node, restage"))


EventName = Literal["done", "parked", "stalled", "budget", "store_unreachable", "store_back"]
EVENT_NAMES: Tuple[EventName, ...] = ("done", "parked", "stalled", "budget", "store_unreachable", "store_back")


class EventsSpec(_Strict):
    """A command run on the login node when the supervisor sees a campaign event."""

    command: Command = Field(description=(
        "argv run without a shell; it gets HPCRUN_EVENT, HPCRUN_CAMPAIGN, HPCRUN_PLAN_DIR and the event "
        "as JSON on stdin"))
    on: List[EventName] = Field(default_factory=lambda: list(EVENT_NAMES), description=(
        "which events run it: done (the campaign finished), parked (jobs were parked), stalled (nothing "
        "changed for stall_after), budget (an allocation found spent, or raised again), store_unreachable "
        "(the supervisor's state store cannot be reached: it waits), store_back (it answers again)"))
    stall_after: Duration = Field(6 * 3600, description="no change for this long is a stall")
    timeout: Duration = Field(60, description="the command is killed after this long")


def effective_rules(spec: RetrySpec) -> Dict[str, Dict[str, Any]]:
    """Every class's rule with the spec's overrides applied (what the manifest records)."""
    out = default_rules(spec.max_attempts, spec.cancelled)
    for name, rule in out.items():
        given = getattr(spec.on, name)
        if given is not None:
            rule.update({k: v for k, v in given.model_dump().items() if v is not None})
    return out
