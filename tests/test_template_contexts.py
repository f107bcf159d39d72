"""Every ``{{ value }}`` in a shell template stands where a quoted word is safe.

The renderer quotes each value as one shell word (hpcrun.shell.finalize). A quoted word is
only inert outside other quotes: inside "..." its single quotes are literal and a
``$(...)`` in the value would run. This reads each shell template like bash does (quotes,
``$(...)`` nesting, comments) and fails on any expression inside quotes, so a template
change cannot reopen the injection class that database.payload once fell into.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

import pytest

from .conftest import REPO

# shell templates only: the HTML pages are escaped by Jinja2's autoescape instead
TEMPLATES = sorted(p for p in (REPO / "templates").glob("*.j2") if not p.name.endswith((".html.j2", ".py.j2")))
# the name of a variable, passed as a string literal by the templates that call the macro
ALLOWED = {("_shell.j2", "{{ pid }}")}
TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{##.*?##\}", re.S)


def expressions_in_quotes(text: str) -> List[Tuple[int, str, str]]:
    """(line, context, expression) for each {{ }} that bash would see inside quotes."""
    found = []
    stack = ["code"]          # code | dq | sq | ansi | sub (a $( ) inside double quotes)
    depth = [0]               # parentheses open in each "sub"/"code" level
    line = 1
    i = 0
    at_word_start = True
    while i < len(text):
        m = TAG.match(text, i)
        if m:
            tag = m.group()
            if tag.startswith("{{") and stack[-1] in ("dq", "sq", "ansi"):
                found.append((line, stack[-1], tag))
            line += tag.count("\n")
            i = m.end()
            at_word_start = False
            continue
        c = text[i]
        top = stack[-1]
        if c == "\n":
            line += 1
        if top in ("code", "sub"):
            if c == "#" and at_word_start:
                j = text.find("\n", i)
                i = len(text) if j < 0 else j
                continue
            if c == "\\":
                i += 2
                continue
            if c == "'" and text[i - 1:i] == "$":
                stack.append("ansi")
            elif c == "'":
                stack.append("sq")
            elif c == '"':
                stack.append("dq")
            elif c == "(":
                depth[-1] += 1
            elif c == ")":
                if top == "sub" and depth[-1] == 0:
                    stack.pop()
                    depth.pop()
                elif depth[-1] > 0:
                    depth[-1] -= 1
        elif top == "dq":
            if c == "\\":
                i += 2
                continue
            if c == '"':
                stack.pop()
            elif text.startswith("$(", i):
                stack.append("sub")
                depth.append(0)
                i += 2
                continue
        elif top == "sq":
            if c == "'":
                stack.pop()
        elif top == "ansi":
            if c == "\\":
                i += 2
                continue
            if c == "'":
                stack.pop()
        at_word_start = c in " \t\n;|&(" or (c == "{" and text[i + 1:i + 2] == " ")
        i += 1
    return found


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_no_value_inside_shell_quotes(template: Path):
    bad = [b for b in expressions_in_quotes(template.read_text()) if (template.name, b[2]) not in ALLOWED]
    assert not bad, "\n".join(f"{template.name}:{line}: {expr} inside {ctx} quotes; assign it to a "
                              "variable first and use \"$var\"" for line, ctx, expr in bad)


@pytest.mark.parametrize("snippet, expected", [
    ('log "x {{ v }}"', ["dq"]),
    ("echo '{{ v }}'", ["sq"]),
    ('x={{ v }}\necho "$x"', []),
    ('# a comment with "{{ v }}"', []),
    ('y="$(tail "$f" | tr \'\\n\' \' \')" {{ v }}', []),
    ('y="$(echo {{ v }})"', []),
    ('y="a $(echo "{{ v }}")"', ["dq"]),
    ("z=$'\\n{{ v }}'", ["ansi"]),
    ('case "$x" in\n  a) {{ v }} ;;\nesac', []),
])
def test_the_checker_itself(snippet, expected):
    assert [ctx for _, ctx, _ in expressions_in_quotes(snippet)] == expected
