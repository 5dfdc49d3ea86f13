"""The tinyctx layer library: one concern per file, built on the public tinyctx API only."""

__all__: list[str] = []
