"""``python -m bridge.mqtt > docs/rules.md``: print the generated rule listing."""

from bridge.mqtt.rules import render_markdown

print(render_markdown(), end="")
