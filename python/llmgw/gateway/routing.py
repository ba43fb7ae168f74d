"""Applying the per-model routing configuration to the Rust router.

The settings of each policy and their defaults live in one place, the Rust
router (`rust/src/router/config.rs`); Python passes the operator's mapping
through and reports the router's own sentence when a field is wrong. Only
`tokenizer` is read here: it names files the worker must load.
"""

from __future__ import annotations

import logging
from typing import Any

from llmgw import _core
from llmgw.config import ConfigError

log = logging.getLogger("llmgw.gateway")

# Policies that weigh what the engines report in /metrics.
_SCRAPING = frozenset({"scored"})


def configure(router: _core.Router, routing: dict[str, dict[str, Any]]) -> bool:
    """Configures every model's policy and tokenizer; True when some policy needs
    engine load scrapes.

    Raises ConfigError naming the model and field when the router refuses a
    setting or a tokenizer cannot be loaded.
    """
    scrape = False
    for model, settings in routing.items():
        rest = {k: v for k, v in settings.items() if k != "tokenizer"}
        try:
            router.configure(model, rest)
        except ValueError as e:
            raise ConfigError(f"gateway.routing.{model}: {e}") from e
        if settings.get("tokenizer"):
            try:
                tok = _core.ModelTokenizer.from_dir(settings["tokenizer"])
            except ValueError as e:
                raise ConfigError(f"gateway.routing.{model}.tokenizer: {e}") from e
            router.set_tokenizer(model, tok)
        scrape = scrape or rest.get("policy") in _SCRAPING
    return scrape


def explain(router: _core.Router, routing: dict[str, dict[str, Any]]) -> list[str]:
    """One line per model whose policy in force is not the one configured, and why."""
    lines = []
    for model in routing:
        st = router.status(model)
        if st.get("effective") != st.get("policy"):
            lines.append(f"model {model}: configured policy {st.get('policy')} runs as "
                         f"{st.get('effective')}: {st.get('why')}")
    return lines


def precise_models(routing: dict[str, dict[str, Any]]) -> list[str]:
    """The models routed by the KV-event index (`kv` policy, or `scored`, which weighs it)."""
    return [m for m, s in routing.items() if s.get("policy") in ("kv", "scored")]


def validate(routing: dict[str, dict[str, Any]], models: list[tuple[str, list[str]]]) -> None:
    """Checks the routing settings at start-up, before any worker exists."""
    router = _core.Router()
    router.set_replicas(models)
    configure(router, routing)
    for m in precise_models(routing):
        router.set_kv_index(m, _core.KvIndex())
    for line in explain(router, routing):
        log.warning("%s", line)
