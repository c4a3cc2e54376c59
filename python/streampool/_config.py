"""The ``STREAMPOOL_*`` variables (docs/abi.md) and the install() options that set them."""

import os
from typing import Dict, List, Mapping, Optional, Tuple

# Every variable the library reads, with the default documented in docs/abi.md.
VARIABLE_DEFAULTS: Dict[str, str] = {
    "STREAMPOOL_DRIVER": "cuda",
    "STREAMPOOL_BACKEND": "vmm",
    "STREAMPOOL_VMM_PAGE_SIZE": "2MiB",
    "STREAMPOOL_VMM_SPAN_SIZE": "auto",
    "STREAMPOOL_VMM_COLD_AFTER": "off",
    "STREAMPOOL_VMM_GROWTH_SLACK": "off",
    "STREAMPOOL_VMM_HEADROOM": "1%",
    "STREAMPOOL_IDLE_RELEASE": "2s",
    "STREAMPOOL_RELEASE_THRESHOLD": "max",
    "STREAMPOOL_MAX_POOL_SIZE": "max",
    "STREAMPOOL_CACHE_LIMIT": "64MiB",
    "STREAMPOOL_CACHE_MAX_BLOCK": "max",
    "STREAMPOOL_SMALL_POOL_MAX": "1MiB",
    "STREAMPOOL_TRIM_ON_GROWTH": "1",
    "STREAMPOOL_PEER_ACCESS": "auto",
    "STREAMPOOL_IPC": "0",
    "STREAMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES": "driver default (on)",
    "STREAMPOOL_REUSE_ALLOW_OPPORTUNISTIC": "driver default (on)",
    "STREAMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES": "driver default (on)",
    "STREAMPOOL_LOG": "warn",
    "STREAMPOOL_SIM_DEVICES": "2",
    "STREAMPOOL_SIM_MEMORY": "16GiB",
}

# install() keyword -> variable.
OPTION_VARIABLES: Dict[str, str] = {
    "backend": "STREAMPOOL_BACKEND",
    "vmm_page_size": "STREAMPOOL_VMM_PAGE_SIZE",
    "vmm_span_size": "STREAMPOOL_VMM_SPAN_SIZE",
    "vmm_cold_after": "STREAMPOOL_VMM_COLD_AFTER",
    "vmm_growth_slack": "STREAMPOOL_VMM_GROWTH_SLACK",
    "vmm_headroom": "STREAMPOOL_VMM_HEADROOM",
    "idle_release": "STREAMPOOL_IDLE_RELEASE",
    "release_threshold": "STREAMPOOL_RELEASE_THRESHOLD",
    "max_pool_size": "STREAMPOOL_MAX_POOL_SIZE",
    "cache_limit": "STREAMPOOL_CACHE_LIMIT",
    "cache_max_block": "STREAMPOOL_CACHE_MAX_BLOCK",
    "small_pool_max": "STREAMPOOL_SMALL_POOL_MAX",
    "trim_on_growth": "STREAMPOOL_TRIM_ON_GROWTH",
    "peer_access": "STREAMPOOL_PEER_ACCESS",
    "ipc": "STREAMPOOL_IPC",
    "reuse_follow_event_dependencies": "STREAMPOOL_REUSE_FOLLOW_EVENT_DEPENDENCIES",
    "reuse_allow_opportunistic": "STREAMPOOL_REUSE_ALLOW_OPPORTUNISTIC",
    "reuse_allow_internal_dependencies": "STREAMPOOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES",
    "log": "STREAMPOOL_LOG",
}


# variable -> (install() option, the value passed, its text in the environment), for the
# options of the latest install() call: the library's error about a malformed value names the
# variable, which the caller never set (name_the_option).
_options_given: Dict[str, Tuple[str, object, str]] = {}


def option_environment(options: Mapping[str, object]) -> Dict[str, str]:
    """The variables that install(**options) sets. Raises TypeError for an unknown option or a
    value that is not a bool, int (bytes) or str; the library validates the text itself."""
    unknown = sorted(set(options) - set(OPTION_VARIABLES))
    if unknown:
        raise TypeError(
            f"install() got unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(OPTION_VARIABLES)}"
        )
    variables = {OPTION_VARIABLES[name]: _env_text(name, value) for name, value in options.items()}
    _options_given.clear()
    _options_given.update(
        {OPTION_VARIABLES[name]: (name, value, variables[OPTION_VARIABLES[name]])
         for name, value in options.items()})
    return variables


def name_the_option(message: str, environ: Mapping[str, str] = os.environ) -> str:
    """The library's message about a malformed variable, naming instead the install() option
    that set it (``install(release_threshold='-5') is not valid: ...``) where the variable
    holds what that option put there; else the message unchanged."""
    for variable, (option, value, text) in _options_given.items():
        end = message.find('" is not valid')  # the value is quoted, escaped as Rust does
        if message.startswith(f'{variable}="') and end > 0 and environ.get(variable) == text:
            return f"install({option}={value!r})" + message[end + 1:]
    return message


def _env_text(name: str, value: object) -> str:
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "1" if value else "0"
    if isinstance(value, str) and c_text_problem(value) is not None:
        from ._lib import CONFIG_ERROR, ConfigError  # (_lib imports this module)

        raise ConfigError(f"install({name}={value!r}) is not valid: an environment variable's "
                          f"value is UTF-8 text without a NUL character", CONFIG_ERROR)
    if isinstance(value, (int, str)):
        return str(value)
    raise TypeError(f"install() option {name} must be a bool, int or str, not {type(value).__name__}")


def c_text_problem(text: str) -> Optional[str]:
    """Why ``text`` cannot be a C string the library reads whole (a NUL, where C would stop; not
    UTF-8), or None."""
    if "\0" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not UTF-8 text ({exc.reason})"
    return None


def variables_in_effect(environ: Mapping[str, str] = os.environ) -> List[Tuple[str, str, str]]:
    """(variable, value, source) for every variable, source being "environment" or "default".
    STREAMPOOL_LOG falls back to RUST_LOG as the library does."""
    rows = []
    for name, default in VARIABLE_DEFAULTS.items():
        if name in environ:
            rows.append((name, environ[name], "environment"))
        elif name == "STREAMPOOL_LOG" and "RUST_LOG" in environ:
            rows.append((name, environ["RUST_LOG"], "environment (RUST_LOG)"))
        else:
            rows.append((name, default, "default"))
    return rows
