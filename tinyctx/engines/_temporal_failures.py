"""What becomes of an exception in a Temporal workflow's run, and what a client reads
from a failed workflow (see "Errors" in docs/durable-engines.md)."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError

from ..steps import NondeterminismError

__all__ = ["TASK_RETRIED", "failure_of", "workflow_failure"]

TASK_RETRIED: tuple[type[Exception], ...] = (NondeterminismError,)
"""Exceptions that fail the workflow *task*, which Temporal retries: a replay on code
other than the recorded, fixed by deploying it. The store's refusals are not among them:
every store call is an activity whose answer the history keeps, so a retried task would
meet the same refusal forever. A workflow fenced out by its own owner takes the thread
back (see ``ActivityStore.write`` in ``_temporal_steps``); one whose thread another owner
took, or another writer changed, has lost it, and fails."""


def workflow_failure(exc: Exception) -> Exception:
    """What an exception leaving the workflow's run becomes.

    One of :data:`TASK_RETRIED` stays itself and fails the workflow task. Temporal's own
    failures (an activity that failed after its attempts, a timeout, a cancellation)
    stay theirs. Any other exception (a tinyctx error, a layer's bug) fails the workflow
    with a non-retryable ``ApplicationError`` carrying its type name and message."""
    if isinstance(exc, (*TASK_RETRIED, FailureError)):
        return exc
    return ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True)


_WRAPPERS = (ActivityError, ChildWorkflowError)
"""Temporal's failures that only say where the error came from (its cause is the error)."""


def failure_of(failed: BaseException) -> tuple[str, str]:
    """The type name and message of the error at the root of a workflow's failure (an
    activity's or child's error is under Temporal's own wrappers)."""
    error: BaseException = failed
    while not isinstance(error, ApplicationError):
        cause = getattr(error, "cause", None)
        if cause is None or (error is not failed and not isinstance(error, _WRAPPERS)):
            break
        error = cause
    if isinstance(error, ApplicationError):
        return error.type or type(error).__name__, error.message
    if isinstance(error, FailureError):
        return type(error).__name__, error.message
    return type(error).__name__, str(error)
