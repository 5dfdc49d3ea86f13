"""Provider failures as tinyctx errors, the same way for every provider.

- the prompt does not fit the context window -> :class:`ContextLimitExceeded` (with the
  provider's words and, when it says them, the numbers), so a budget guard can compact and
  try again;
- rate limit, overload, a server error, a timeout or a dropped connection ->
  :class:`RetryableProviderError` with ``retry_after`` from the response headers, for a
  Retry layer;
- anything else (bad request, authentication, quota, not found) -> :class:`ProviderError`
  with the HTTP status.

The rules follow the SDKs' own retry policy (408, 409, 429 and 5xx are worth another try;
an ``x-should-retry`` header decides when present), except that a spent quota is final.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

from ..errors import ContextLimitExceeded, ProviderError, RetryableProviderError

__all__ = ["classify", "retry_after", "error_details", "ErrorKind"]

ErrorKind = Literal["status", "connection", "stream"]

_OVERFLOW_CODES: Final = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded"}
)
_OVERFLOW_TEXT: Final = re.compile(
    r"context[ _-]?(?:length|window|size|limit)|maximum context|prompt is too long|"
    r"too many (?:input )?tokens|input is too long|reduce the length of the (?:messages|prompt)|"
    r"input token count \(?\d+\)? exceeds the maximum",
    re.IGNORECASE,
)
_RETRYABLE_TYPES: Final = frozenset(
    {
        "overloaded_error",
        "rate_limit_error",
        "api_error",
        "timeout_error",
        "server_error",
        "rate_limit_exceeded",
        "service_unavailable",
    }
)
_FINAL_CODES: Final = re.compile(r"quota|spend_limit|billing", re.IGNORECASE)
_NUMBER_PATTERNS: Final = (
    # Anthropic: "prompt is too long: 208656 tokens > 200000 maximum"
    (re.compile(r"(\d+) tokens > (\d+) maximum"), ("estimate", "window")),
    # Anthropic: "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000"
    (re.compile(r"(\d+) \+ (\d+) > (\d+)"), ("estimate", "reserved", "window")),
    # OpenAI and vLLM: "maximum context length is 8192 tokens. However, your messages
    # resulted in 8227 tokens" / "you requested 4120 tokens (3120 in the messages, ...)"
    (re.compile(r"maximum context length is (\d+) tokens"), ("window",)),
    (re.compile(r"(?:resulted in|requested) (\d+) tokens"), ("estimate",)),
    # Gemini: "The input token count (1200000) exceeds the maximum number of tokens
    # allowed (1048576)."
    (
        re.compile(
            r"input token count \(?(\d+)\)? exceeds the maximum number of tokens allowed \(?(\d+)"
        ),
        ("estimate", "window"),
    ),
)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP
    date); None when the response says nothing usable."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_details(body: object, fallback: str) -> tuple[str, str | None, str | None]:
    """``(message, code, type)`` of an error body: OpenAI and Anthropic nest them under
    ``error``; vLLM and llama.cpp variants put them at the top."""
    message, code, kind = fallback, None, None
    if isinstance(body, Mapping):
        inner = body.get("error")
        source: Mapping[str, Any] = inner if isinstance(inner, Mapping) else body
        if isinstance(inner, str):
            message = inner
        text = source.get("message")
        if isinstance(text, str) and text:
            message = text
        raw_code = source.get("code")
        code = str(raw_code) if raw_code is not None else None
        details = source.get("details")
        if isinstance(details, Mapping) and isinstance(details.get("error_code"), str):
            code = details["error_code"]
        raw_type = source.get("type")
        kind = raw_type if isinstance(raw_type, str) else None
    elif isinstance(body, str) and body:
        message = body
    return message, code, kind


def _overflow_numbers(message: str, body: object) -> dict[str, int]:
    numbers: dict[str, int] = {}
    for pattern, names in _NUMBER_PATTERNS:
        match = pattern.search(message)
        if match:
            for name, value in zip(names, match.groups(), strict=True):
                numbers.setdefault(name, int(value))
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if isinstance(error, Mapping):  # llama.cpp: n_prompt_tokens / n_ctx
        for key, name in (("n_prompt_tokens", "estimate"), ("n_ctx", "window")):
            if isinstance(error.get(key), int):
                numbers.setdefault(name, error[key])
    return numbers


def _is_overflow(status: int | None, message: str, code: str | None, kind: str | None) -> bool:
    if code in _OVERFLOW_CODES or kind in _OVERFLOW_CODES:
        return True
    if status == 413:
        return True
    if status not in (None, 400) and kind != "invalid_request_error":
        return False
    return bool(_OVERFLOW_TEXT.search(message))


def classify(
    provider: str,
    *,
    kind: ErrorKind,
    message: str,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
    body: object = None,
) -> ContextLimitExceeded | ProviderError:
    """The tinyctx error for one provider failure (``kind``: an HTTP error status, a
    connection that failed or timed out, or an error event in the middle of a stream)."""
    text, code, error_type = error_details(body, message)
    if kind == "connection":
        return RetryableProviderError(
            f"{provider}: {text} (connection failed; worth another attempt)", provider=provider
        )
    if _is_overflow(status if kind == "status" else None, text, code, error_type):
        numbers = _overflow_numbers(text, body)
        return ContextLimitExceeded(
            f"{provider}: the prompt does not fit the model's context window: {text}",
            estimate=numbers.get("estimate"),
            window=numbers.get("window"),
            reserved=numbers.get("reserved", 0),
            provider_message=text,
        )
    should = headers.get("x-should-retry") if headers else None
    final = bool(code and _FINAL_CODES.search(code))
    if should is not None:
        retryable = should == "true"
    elif kind == "stream":
        retryable = error_type in _RETRYABLE_TYPES
    else:
        retryable = status is not None and (status in (408, 409, 429) or status >= 500)
        retryable = retryable or error_type in _RETRYABLE_TYPES
    shown = f"{provider} API error" + (f" {status}" if status else "") + f": {text}"
    if error_type or code:
        shown += f" ({', '.join(p for p in (error_type, code) if p)})"
    if retryable and not final:
        return RetryableProviderError(
            shown, status=status, provider=provider, retry_after=retry_after(headers)
        )
    return ProviderError(shown, status=status, provider=provider)
