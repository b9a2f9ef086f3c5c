"""Write docs/options.md from ``SinkOptions``: ``python scripts/options_doc.py > docs/options.md``."""

from mvsink.options_doc import options_markdown

print(options_markdown(), end="")
