"""Colibri: bake a mixture-of-experts model into one native, static server."""

__version__ = "0.1.0"

try:  # the compiled engine binding; absent when run from a source checkout
    from ._engine import Engine, Tokenizer  # noqa: F401
except ImportError:  # pragma: no cover
    Engine = Tokenizer = None  # type: ignore[assignment,misc]
