"""Linear scans for the delimited parts of a completion (answer tags, fenced code blocks).

Regular expressions like ``<answer>(.*?)</answer>`` or ```` ```([^\\n]*)\\n(.*?)``` ```` restart a
scan to the end of the text at every opener that has no closer: quadratic on crafted input (many
openers, a long run of backticks), seconds of parent CPU at the completion size cap, holding the
GIL while other completions in the batch wait. ``str.find`` moves forward only, so each function
here reads the text a bounded number of times.
"""

from __future__ import annotations


def tagged(text: str, open_tag: str, close_tag: str) -> list[str]:
    """Bodies of ``open_tag … close_tag`` pairs, left to right, non-nested (the first closer ends
    a body). Once an opener has no closer after it, no later opener can have one: stop."""
    found, pos = [], 0
    while True:
        i = text.find(open_tag, pos)
        if i < 0:
            return found
        j = text.find(close_tag, i + len(open_tag))
        if j < 0:
            return found
        found.append(text[i + len(open_tag) : j])
        pos = j + len(close_tag)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of each fenced block: three backticks, the rest of that line as the
    info string, then the body up to the next three backticks."""
    found, pos = [], 0
    while True:
        i = text.find("```", pos)
        if i < 0:
            return found
        nl = text.find("\n", i + 3)
        if nl < 0:
            return found
        j = text.find("```", nl + 1)
        if j < 0:
            return found
        found.append((text[i + 3 : nl], text[nl + 1 : j]))
        pos = j + 3
